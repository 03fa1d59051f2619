"""The newest recorded figure of every preset, op and precision, from `specgen bench`
text logs: the fastest verified specgen kernel beside cuDNN of the same precision *from
the same run*, with the log's date, GPU and commit.  BENCHMARKS.md's first table.

    python3 scripts/bench_table.py [--gpu h200] [LOG ...]   (default: docs/measurements/*)

A log counts when its name holds the date (YYYY-MM-DD) and the GPU (h200, h100); the
commit is the hex word after the GPU where the name has one.  A figure is taken from the
newest log that has a verified row of that preset, op and precision; among that log's
rows of the precision, the fastest.  Logs of one date are ordered by their commits'
place in this repository's history (a log without a known commit comes first).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

HEADER = re.compile(r"^(?P<slug>[a-z0-9-]+) B=(?P<batch>\d+): floor (?P<floor>[0-9.]+) ms")
ROW = re.compile(r"^(?P<label>\S+)\s+(?P<prec>fp32|tf32|fp16|bf16)\s+(?P<ms>[0-9.]+)\s")
NAME = re.compile(
    r"(?P<date>20\d\d-\d\d-\d\d)[a-z]?-(?P<gpu>h200|h100)(?:-(?P<commit>[0-9a-f]{7}))?"
)
OPS = ("dgrad", "wgrad", "bgrad")


def _op(label: str) -> str:
    return next((op for op in OPS if f"_{op}" in label), "fprop")


def read_log(path: Path):
    """(slug, batch, floor, cudnn rows {prec: ms}, specgen rows [(label, prec, ms, op)])
    for each block of a bench log."""
    block = None
    for line in path.read_text(errors="replace").splitlines():
        head = HEADER.match(line)
        if head:
            if block:
                yield block
            block = dict(slug=head["slug"], batch=int(head["batch"]), floor=float(head["floor"]))
            block.update(cudnn={}, rows=[])
            continue
        row = ROW.match(line)
        if block is None or row is None:
            continue
        if row["label"].startswith("cudnn-"):
            block["cudnn"][row["prec"]] = float(row["ms"])
        elif "verified" in line:
            block["rows"].append((row["label"], row["prec"], float(row["ms"]), _op(row["label"])))
    if block:
        yield block


def commit_order(root: Path) -> dict[str, int]:
    """Each commit's 7-hex prefix -> its place in the history, oldest first (empty
    outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "log", "--format=%H"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {h[:7]: i for i, h in enumerate(reversed(out))}


def newest(paths, gpu: str, order: dict[str, int] | None = None) -> dict:
    """(slug, op, prec) -> the figure of the newest log that has it: by date, then by
    commit (``order``)."""
    order = order or {}
    best: dict = {}
    for path in paths:
        name = NAME.search(path.name)
        if not name or name["gpu"] != gpu:
            continue
        for block in read_log(path):
            for label, prec, ms, op in block["rows"]:
                key = (block["slug"], op, prec)
                cudnn = block["cudnn"].get(prec)
                if cudnn is None and len(block["cudnn"]) == 1:
                    cudnn = next(iter(block["cudnn"].values()))  # a 16-bit preset's own
                figure = dict(
                    label=label,
                    ms=ms,
                    cudnn=cudnn,
                    batch=block["batch"],
                    floor=block["floor"],
                    date=name["date"],
                    commit=name["commit"] or "-",
                    log=path.name,
                    age=(name["date"], order.get(name["commit"] or "", -1)),
                )
                old = best.get(key)
                if old is None or (figure["age"], -ms) > (old["age"], -old["ms"]):
                    best[key] = figure
    return best


def table(best: dict) -> str:
    order = {op: i for i, op in enumerate(("fprop",) + OPS)}
    lines = [
        "| preset (B) | op | math | specgen kernel | ms | cuDNN ms | speed-up | x floor | date | commit | log |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (slug, op, prec), f in sorted(
        best.items(), key=lambda kv: (kv[0][0], order[kv[0][1]], kv[0][2])
    ):
        speed = f"{f['cudnn'] / f['ms']:.2f}x" if f["cudnn"] else "-"
        cudnn = f"{f['cudnn']:.3f}" if f["cudnn"] else "-"
        floor = f"{f['ms'] / f['floor']:.2f}" if op == "fprop" else "-"
        lines.append(
            f"| {slug} ({f['batch']}) | {op} | {prec} | `{f['label']}` | {f['ms']:.3f} | {cudnn} "
            f"| {speed} | {floor} | {f['date']} | {f['commit']} | {f['log']} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="*", type=Path)
    ap.add_argument("--gpu", default="h200", choices=("h200", "h100"))
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent / "docs" / "measurements"
    paths = args.logs or sorted(root.glob("*.log"))
    print(table(newest(paths, args.gpu, commit_order(root))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
