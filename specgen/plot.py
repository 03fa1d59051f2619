"""A roofline-style chart of a bench report: each kernel at its arithmetic intensity
and achieved rate, under the measured copy-bandwidth and fp32 ceilings (and a 16-bit
tensor-core ceiling where the report carries one)."""

from __future__ import annotations

import io
from pathlib import Path

from .errors import SpecError
from .files import atomic_write
from .shapes import PRESETS, parse_shape


def require_matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError("--plot needs matplotlib: pip install 'specgen[plot]'") from None
    return plt


def roofline(report: dict, path: Path) -> None:
    plt = require_matplotlib()
    ceil = report["ceilings"]
    bw, peak = ceil["copy_bytes_per_s"], ceil["fp32_flops_per_s"]
    fig, ax = plt.subplots(figsize=(9, 6))
    xs = [2.0**e for e in range(-2, 12)]
    ax.plot(
        xs, [min(peak, bw * x) / 1e12 for x in xs], "k-", lw=1, label="copy bandwidth / fp32 SGEMM"
    )
    tensor = ceil.get("tensor_flops_per_s")  # a 16-bit GEMM's rate, where the report has it
    if tensor:
        ax.plot(
            xs,
            [min(tensor, bw * x) / 1e12 for x in xs],
            "k--",
            lw=1,
            label="copy bandwidth / 16-bit tensor-core GEMM",
        )
    markers = {"cudnn": "x", "fp32": "o", "tf32": "s", "fp16": "^", "bf16": "v"}
    for i, (slug, data) in enumerate(report["shapes"].items()):
        shape = parse_shape(data["spec"]) if "spec" in data else PRESETS[slug]
        intensity = shape.flops(data["batch"]) / shape.bytes_moved(data["batch"])
        color = f"C{i % 10}"
        for row in data["rows"]:
            kind = "cudnn" if row["label"].startswith("cudnn") else row["precision"]
            ax.scatter(intensity, row["tflops"], marker=markers[kind], color=color, s=30, alpha=0.8)
        best = max(
            (r for r in data["rows"] if not r["label"].startswith("cudnn")),
            key=lambda r: r["tflops"],
            default=None,
        )
        if best:
            ax.annotate(
                data.get("label", slug),
                (intensity, best["tflops"]),
                fontsize=8,
                color=color,
                xytext=(6, 4 - 10 * i),  # shapes of one intensity: one label under another
                textcoords="offset points",
            )
    for kind, m in markers.items():
        ax.scatter(
            [], [], marker=m, color="gray", label="cuDNN" if kind == "cudnn" else f"specgen {kind}"
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of the fewest bytes moved)")
    ax.set_ylabel("TFLOP/s (useful FLOPs / median time)")
    ax.set_title(f"specgen bench on {report['device']}")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write(path, png.getvalue())
