"""Mutation check of the CPU tier: each mutant is one small wrong change to specgen (a
template term dropped, a constant loosened, a boundary moved, a convention flipped),
applied alone to a copy of the tree; the CPU tier (what CI runs) then either fails
(the mutant is killed) or passes (it survived, and a test is missing).

    .venv/bin/python scripts/mutants.py [--only NAME ...] [--log FILE]

Each mutant regenerates generated/ (as `make generated` would after a template change),
then runs `pytest -q -x -n auto` over the copy, with the compile cache of the real
tree shared (read and written), so a warm cache makes a mutant cost a minute or less.
The table at the end gives each mutant, its verdict and the first failing test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (name, file, text, replacement): the text must occur in the file exactly once.
MUTANTS = [
    ("control: no change", "specgen/__init__.py", "__version__", "__version__"),
    (
        "bias add dropped from the epilogue",
        "templates/common/epilogue.j2",
        '{%- if bias %}{% set e = e ~ " + " ~ (bias_value or "__ldg(&bias[" ~ map ~ "])") %}'
        "{% endif -%}",
        "",
    ),
    (
        "relu dropped from the epilogue",
        "templates/common/epilogue.j2",
        '{%- if relu %}{% set e = "fmaxf(" ~ e ~ ", 0.0f)" %}{% endif -%}',
        "",
    ),
    (
        "bf16 unit roundoff 8x looser",
        "specgen/reference.py",
        "U_BF16 = 2.0**-8",
        "U_BF16 = 2.0**-5",
    ),
    (
        "fp16/tf32 unit roundoff 2x looser",
        "specgen/reference.py",
        "U_HALF = 2.0**-11",
        "U_HALF = 2.0**-10",
    ),
    (
        "pad=same's odd pixel at the start",
        "specgen/shapes.py",
        "return (th // 2, th - th // 2, tw // 2, tw - tw // 2)",
        "return (th - th // 2, th // 2, tw - tw // 2, tw // 2)",
    ),
    (
        "thread limit one warp higher",
        "specgen/plan/common.py",
        "MAX_THREADS = 1024",
        "MAX_THREADS = 1056",
    ),
    (
        "bf16 rounding toward zero",
        "templates/common/dtype.j2",
        'asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));',
        'asm("cvt.rz.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));',
    ),
    (
        "output height without the last row",
        "specgen/shapes.py",
        "return (self.H + pt + pb - self.dil[0] * (self.R - 1) - 1) // self.stride[0] + 1",
        "return (self.H + pt + pb - self.dil[0] * (self.R - 1) - 1) // self.stride[0]",
    ),
    (
        "reference ignores the row dilation",
        "specgen/reference.py",
        "i0, j0 = p * dh, q * dw",
        "i0, j0 = p, q * dw",
    ),
    (
        "cache key without the architecture",
        "specgen/compile.py",
        '        "\\0".join(options_for(arch)),\n        arch,\n',
        '        "\\0".join(options_for("sm_90")),\n',
    ),
    (
        "grid's y limit one past the hardware's",
        "specgen/plan/common.py",
        "GRID_LIMITS = (2**31 - 1, 65535, 65535)",
        "GRID_LIMITS = (2**31 - 1, 65536, 65535)",
    ),
    (
        "static shared memory limit 64 KiB",
        "specgen/plan/common.py",
        "STATIC_SMEM_BYTES = 48 * 1024",
        "STATIC_SMEM_BYTES = 64 * 1024",
    ),
    (
        "pack2's halves swapped",
        "templates/common/pack2.j2",
        '"f"(hi), "f"(lo)',
        '"f"(lo), "f"(hi)',
    ),
    (
        "bf16 output rounding left out of the bound",
        "specgen/reference.py",
        "DType.BF16: U_BF16}",
        "DType.BF16: 0.0}",
    ),
    (
        "fp32 unit roundoff 2x looser",
        "specgen/reference.py",
        "U_FP32 = 2.0**-24",
        "U_FP32 = 2.0**-23",
    ),
    (
        "db summed over the maps' rows only",
        "specgen/reference.py",
        "return xp.asarray(dy, dtype=xp.float64).sum(axis=(0, 2, 3))",
        "return xp.asarray(dy, dtype=xp.float64).sum(axis=(0, 2))[..., 0]",
    ),
    (
        "no second launch bound when the first spills",
        "specgen/compile.py",
        'if binary.spills and f"#ifndef {ALT_BOUNDS}" in source:',
        'if False and f"#ifndef {ALT_BOUNDS}" in source:',
    ),
    (
        "shipped winners before this GPU's tuned ones",
        "specgen/choose.py",
        "        tuned(problem, gpu, allow_tf32, arch)\n        or shipped(problem, gpu, allow_tf32, arch)",
        "        shipped(problem, gpu, allow_tf32, arch)\n        or tuned(problem, gpu, allow_tf32, arch)",
    ),
    (
        "mmahwc's swizzle on the wrong address bits",
        "specgen/strategies/mmahwc.py",
        "return at ^ ((at >> 3) & 0x70)",
        "return at ^ ((at >> 4) & 0x70)",
    ),
    (
        "tc3wgrad's halo start not rounded to a 16-byte unit",
        "specgen/strategies/tc3wgrad.py",
        "x0 = ceil_div(pl, UNIT) * UNIT",
        "x0 = pl",
    ),
    (
        "wsplit's input row without the padding",
        "templates/backward/wgrad.cu.j2",
        "const int iy = oy * {{ sh }} + r * {{ dh }} - {{ pt }};",
        "const int iy = oy * {{ sh }} + r * {{ dh }};",
    ),
    (
        "wsplit's column guard dropped",
        "templates/backward/wgrad.cu.j2",
        "const float v = (unsigned)(ix + {{ s * dw }}) < {{ W }}u ? {{ widen(src) }} : 0.0f;",
        "const float v = {{ widen(src) }};",
    ),
    (
        "bgrad's sum of dy dropped",
        "templates/backward/wgrad.cu.j2",
        "                acc[{{ i }}][0] += d[{{ i }}];",
        "                acc[{{ i }}][0] += 0.0f;",
    ),
]


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".git", ".venv", ".cache", "__pycache__", "*.egg-info", "build")
    shutil.copytree(REPO, dest, ignore=ignore, dirs_exist_ok=True)


def run_mutant(name: str, rel: str, text: str, new: str) -> tuple[str, str, float]:
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        tree = Path(tmp) / "tree"
        _copy_tree(tree)
        path = tree / rel
        source = path.read_text()
        if source.count(text) != 1:
            return "stale", f"the text occurs {source.count(text)} times in {rel}", 0.0
        path.write_text(source.replace(text, new))
        env = dict(
            os.environ,
            PYTHONPATH=str(tree),
            SPECGEN_CACHE_DIR=str(REPO / ".cache" / "specgen"),
            PYTHONDONTWRITEBYTECODE="1",
        )
        # As a developer would after changing a template: generated/ follows it, so the
        # sync test alone cannot kill a template mutant.
        for old in (tree / "generated").glob("*/*.cu"):
            old.unlink()
        emit = [sys.executable, "-m", "specgen", "emit", "--all-shapes", "--op", "all", "--all"]
        subprocess.run(emit, cwd=tree, env=env, capture_output=True)
        start = time.monotonic()
        out = subprocess.run(
            # test_install builds a wheel into a fresh virtualenv, which PYTHONPATH would
            # point back at the copy: it checks packaging, which no mutant touches.
            [sys.executable, "-m", "pytest", "-q", "-x", "-n", "auto", "-p", "no:cacheprovider"]
            + ["--ignore=tests/test_install.py"],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
        )
        took = time.monotonic() - start
        failed = [l for l in out.stdout.splitlines() if l.startswith(("FAILED", "ERROR"))]
        if out.returncode == 0:
            return "SURVIVED", "", took
        return "killed", (failed[0] if failed else out.stdout.strip().splitlines()[-1])[:150], took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="run the mutants whose name contains one of these")
    ap.add_argument("--log", type=Path, help="write the table here as well")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if not args.only or any(o in m[0] for o in args.only)]
    rows = []
    for i, (name, rel, text, new) in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {name} ...", file=sys.stderr, flush=True)
        verdict, first, took = run_mutant(name, rel, text, new)
        rows.append((name, rel, verdict, took, first))
        print(f"    {verdict} in {took:.0f} s {first}", file=sys.stderr, flush=True)
    lines = ["| mutant | file | verdict | s | first failure |", "|---|---|---|---|---|"]
    lines += [f"| {n} | `{r}` | {v} | {t:.0f} | {f} |" for n, r, v, t, f in rows]
    mutants = [r for r in rows if not r[0].startswith("control")]
    killed = sum(v == "killed" for _, _, v, _, _ in mutants)
    lines.append(f"\n{killed} of {len(mutants)} mutants killed by the CPU tier.")
    text = "\n".join(lines)
    print(text)
    if args.log:
        args.log.write_text(text + "\n")
    control = [v for n, _, v, _, _ in rows if n.startswith("control")]
    return 0 if killed == len(mutants) and control in ([], ["SURVIVED"]) else 1


if __name__ == "__main__":
    sys.exit(main())
