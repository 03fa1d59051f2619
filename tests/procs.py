"""specgen as a shell starts a job: a process group of its own, for the tests that
signal it as a terminal's Ctrl-C (SIGINT to the group) or ``timeout`` would."""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path


@contextlib.contextmanager
def specgen_job(args: list[str], env: dict):
    """``python -m specgen ARGS`` in a process group of its own, its output piped;
    on leaving, whatever happened, the whole group is killed and the process reaped."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgen", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        # as from a terminal: a job started in the background inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        yield proc
    finally:  # nothing of the test keeps running
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def running_in_group(pgid: int) -> list[int]:
    """The processes of group ``pgid`` not yet ended (a zombie waiting for the init
    process to collect it has ended); empty where Linux's /proc is not there to say."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue  # ended as it was read
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out
