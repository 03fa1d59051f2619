"""Dask's preload for every worker of an embedded tune cluster (``dist.connect``): the
signals a process group gets (a terminal's Ctrl-C, ``timeout``'s SIGTERM) left to the
tune's own process.  It ends the tune and closes the cluster in order; a worker that
died of the signal instead was restarted by its nanny as the cluster closed, and the
scheduler logged each lost connection (an H200 tune of 16 workers ended by ``timeout``:
30 lines of errors, and 30 s of broadcasts to them before the process exited).  A
worker still ends with the tune's process: Dask's worker processes exit when their
parent does, and the nanny kills one that a close does not end."""

from __future__ import annotations

import signal


def dask_setup(worker) -> None:
    """Dask calls this once in each worker process that preloads this module."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
