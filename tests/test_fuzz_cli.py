"""CPU tier: hypothesis drives the command line with hostile arguments.

Each call must end with exit status 0 or 2 (1 only where verify reports a failed
check), never with a traceback; a refusal is exactly one line on stderr; and every call
returns within a time bound.  The compile and GPU steps are stubbed (NVRTC and the
timing verbs have tests of their own), so what is fuzzed is parsing, selection,
planning, rendering and writing.
"""

import os
import re
import signal
import time

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specgen import cli
from specgen.errors import SpecError
from specgen.shapes import PRESETS
from specgen.verify import Row

EXAMPLES = 1000
SECONDS = 30  # per call; emit --all-shapes --all renders every preset's set

NUMBERS = ["0", "-1", "1", "2", "3", "4", "7", "8", "16", "17", "33", "64", "128", "65535"]
NUMBERS += ["65536", "2147483647", "2147483648", "1000000000001", "9" * 40, "-0", "+3"]
ODD = ["", " ", "x", "é", "١٢", "4x4", "0x4", "16x48", "x4y1m4", "x0y1m1", "1e3", "0.5"]
ODD += ["planar", "inter", "const", "global", "fp32", "tf32", "fp16", "sm_90", "sm_10", "\n"]
WORDS = list(PRESETS) + ["direct", "tiled", "split", "im2col", "implicit", "mma", "mmatile"]
WORDS += ["persist", "mmapersist", "stream", "layer7", "persist_t12_r4x17_fp32"]
WORDS += ["tiled_t16_x4y1m8_planar_wconst_lc_fp32", "mma_t64_fp16", "stream_t8_m128_c8_r8x8"]
WORDS += ["fprop", "dgrad", "wgrad", "bgrad", "all", "phased", "wband", "wsplit", "inputtile"]
WORDS += ["wband_t20_m4_p4_w1_s1056_fp32_wgrad", "persist_t25_r4x10_fp32_dgrad"]

number = st.sampled_from(NUMBERS)
value = st.one_of(
    st.sampled_from(NUMBERS + ODD + WORDS),
    st.text(max_size=8),
    st.integers(-(2**40), 2**40).map(str),
    st.builds(lambda a, b, c: f"x{a}y{b}m{c}", number, number, number),  # coarsening
    st.builds(lambda a, b: f"{a}x{b}", number, number),  # register tile, K=RxS
)
spec_item = st.one_of(
    st.builds(
        lambda k, v: f"{k}={v}",
        st.sampled_from(["C", "M", "H", "W", "K", "pad", "PAD", "c", "Q", "", "K ", "op", "OP"]),
        value,
    ),
    value,
)
small = st.integers(1, 40).map(str)
plausible_spec = st.builds(
    lambda c, m, h, w, k, p: f"C={c},M={m},H={h},W={w},K={k},pad={p}",
    small,
    small,
    st.integers(1, 64).map(str),
    st.integers(1, 64).map(str),
    st.sampled_from(["1", "3", "5", "7"]),
    st.sampled_from(["0", "1", "2", "3"]),
)
shape_text = st.one_of(
    st.sampled_from(list(PRESETS)),
    plausible_spec,
    st.lists(spec_item, max_size=8).map(",".join),
    value,
)

VALUED = ["--shape", "--variant", "--strategy", "--tile", "--coarsening", "--layout"]
VALUED += ["--weights", "--precision", "--regtile", "--splits", "--maps", "--chunk"]
VALUED += ["--batch", "--arch", "--jobs", "--budget", "--out", "--json", "--plot", "--gpu"]
VALUED += ["--op", "--op", "--pixels", "--warps"]
FLAGS = ["--all", "--all-shapes", "--best", "--unroll-channels", "--loop-channels", "--help"]
FLAGS += ["--bogus", "-x", "--", "--atomic", "--slices"]


@st.composite
def argv(draw):
    verb = draw(st.sampled_from(["emit", "emit", "emit", "verify", "verify", "bench", "tune"]))
    args = [verb]
    if draw(st.booleans()) or draw(st.booleans()):
        args += ["--shape", draw(shape_text)]
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.integers(0, 3)):
            name = draw(st.sampled_from(VALUED))
            if name in ("--out", "--json", "--plot"):
                continue  # paths are the tests' own, below
            args += [name, draw(value)]
        else:
            args.append(draw(st.sampled_from(FLAGS)))
    if draw(st.integers(0, 9)) == 0:
        args = [verb] + draw(st.lists(value, max_size=4))  # positional junk
    return args


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _verify_row(shape, variant, *, arch, batch, numbers, rng=None):
    """verify's per-variant step without NVRTC: plan and render for real."""
    from specgen.plan import make_plan
    from specgen.render import render

    plan = make_plan(shape, variant)
    render(plan)
    return Row(shape.slug, plan.name, plan.variant.precision.value, status="COMPILED")


def _no_gpu(verb):
    raise SpecError(f"{verb} times kernels and needs a CUDA GPU; none is visible here")


MESSAGES: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    kinds = {re.sub(r"'[^']*'|\d+", "#", m): m for m in MESSAGES}
    print(f"\nfuzz: {len(MESSAGES)} distinct error messages, {len(kinds)} distinct kinds")
    if os.environ.get("SPECGEN_FUZZ_REPORT"):  # one example of each kind, to read
        with open(os.environ["SPECGEN_FUZZ_REPORT"], "w") as f:
            f.writelines(f"{m}\n    <- {MESSAGES[m]}\n" for m in sorted(kinds.values()))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(args=argv())
def test_cli_never_crashes(args, tmp_path_factory, monkeypatch_module):
    out = tmp_path_factory.mktemp("out")
    if args[0] == "emit":
        args = args + ["--out", str(out)]
    elif args[0] == "bench" and "--json" not in args:
        args = args + ["--json", str(out / "report.json")]
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    started = time.monotonic()
    try:
        r = CliRunner().invoke(cli.main, args)
    except _Timeout:
        pytest.fail(f"no answer within {SECONDS} s: {args!r}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert not isinstance(r.exception, _Timeout), f"no answer within {SECONDS} s: {args!r}"
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, repr(r.exception))
    assert "Traceback" not in r.output
    allowed = {0, 2} | ({1} if args[0] == "verify" else set())
    assert r.exit_code in allowed, (args, r.exit_code, r.output)
    if r.exit_code == 2:
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, r.stderr)
        MESSAGES[lines[0]] = " ".join(args)
    assert time.monotonic() - started < SECONDS


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    mp.setattr("specgen.verify.verify_variant", _verify_row)
    mp.setattr("specgen.parallel.precompile", lambda *a, **k: {})
    mp.setattr("specgen.runtime.gpu_available", lambda: False)
    mp.setattr(cli, "_need_gpu", _no_gpu)
    yield mp
    mp.undo()


def test_the_fuzz_met_many_kinds_of_refusal():
    """Runs after the fuzz in this module: a fuzz that only ever met one message (say, a
    parser refusing everything) would not be testing the rest."""
    if len(MESSAGES) < 10:
        pytest.skip("run with test_cli_never_crashes")
    kinds = {re.sub(r"'[^']*'|\d+", "#", m) for m in MESSAGES}
    assert len(kinds) >= 20, sorted(kinds)
