"""The tensor-core roofline of BENCHMARKS.md, drawn from `specgen bench` text logs.

    python3 scripts/roofline_tc.py OUT.png TENSOR_TFLOPS LOG...

Each log is one `specgen bench --shape S [--op OP]` run; its header gives the shape,
batch and the copy and SGEMM ceilings it measured, its rows each kernel's rate.  The
16-bit tensor-core ceiling is a figure measured apart (a bf16 GEMM), given in TFLOP/s.
"""

import re
import sys
from pathlib import Path

from specgen.plot import roofline
from specgen.shapes import PRESETS, Op

HEADER = re.compile(r"^(\S+) B=(\d+): .*copy ([\d.]+) TB/s, SGEMM ([\d.]+) TFLOP/s")
ROW = re.compile(r"^(\S+)\s+(fp32|tf32|fp16|bf16)\s+([\d.]+)\s+\S+\s+([\d.]+)\s")


def main(out: str, tensor_tflops: str, *logs: str) -> int:
    shapes, ceilings, layouts = {}, {}, set()
    for log in logs:
        op = Op.DGRAD if "dgrad" in Path(log).name else Op.FPROP
        current = None
        for line in Path(log).read_text().splitlines():
            if m := HEADER.match(line):
                slug, batch = m.group(1), int(m.group(2))
                layouts.add(PRESETS[slug].layout.value.upper())
                spec = PRESETS[slug].with_op(op).spec if op is Op.DGRAD else slug
                label = f"{slug} {op.value}"
                current = shapes.setdefault(spec, dict(batch=batch, rows=[], label=label))
                ceilings = dict(
                    copy_bytes_per_s=float(m.group(3)) * 1e12,
                    fp32_flops_per_s=float(m.group(4)) * 1e12,
                    tensor_flops_per_s=float(tensor_tflops) * 1e12,
                )
            elif current is not None and (m := ROW.match(line)):
                current["rows"].append(
                    dict(label=m.group(1), precision=m.group(2), tflops=float(m.group(4)))
                )
    device = f"NVIDIA H200 (16-bit {' and '.join(sorted(layouts))})"
    report = dict(shapes=shapes, ceilings=ceilings, device=device)
    roofline(report, Path(out))
    print(f"wrote {out}: {sum(len(d['rows']) for d in shapes.values())} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
