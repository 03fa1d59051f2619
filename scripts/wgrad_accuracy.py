"""How close fp32 wgrad comes to float64 on the autoencoder's layers (NCHW, B=128):
cuDNN in fp32 and tf32 beside specgen's kernels, each as the relative L2 error of dw
and its bias (the error's mean along the sign of the reference, over the mean |dw|),
on inputs like the model's (x >= 0 after a ReLU, dy of both signs).

    PYTHONPATH=. python3 scripts/wgrad_accuracy.py [--batch 128] [--variant PRESET:NAME ...]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import cupy
import torch
from torch.nn.grad import conv2d_weight

from specgen.runtime import Conv
from specgen.shapes import PRESETS, Op
from specgen.strategies import parse_variant_name
from specgen.tensors import Role

DEFAULT = [
    "ae-enc2:wtap_t8_m32_c16_p4_r4x3_w1_q3_s12_fp32_wgrad",
    "ae-enc2:tc3wgrad_b64x32_w2x4_r8_p3_s8_fp32_wgrad",
    "ae-enc2:tc3wgrad_b64x32_w2x4_r8_p3_s32_fp32_wgrad",
    "ae-enc2:wgemm_b128x128_k8_s29_fp32_wgrad",
    "ae-enc1:wtap_t16_m32_c3_p4_r2x1_w3_q2_s132_fp32_wgrad",
    "ae-enc1:tc3wgrad_b64x8_w2x1_r2_p4_s66_fp32_wgrad",
    "ae-dec1:tc3wgrad_b64x32_w2x4_r8_p4_s16_fp32_wgrad",
    "ae-dec1:wgemm_b128x128_k8_s29_fp32_wgrad",
]


def errors(dw, ref):
    err = dw.double() - ref
    rel = (err.norm() / ref.norm()).item()
    bias = ((err * ref.sign()).mean() / ref.abs().mean()).item()
    return rel, bias


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--variant", action="append")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    done = {}
    for item in args.variant or DEFAULT:
        preset, name = item.split(":")
        p = PRESETS[preset]
        B = args.batch
        if preset not in done:
            x = torch.relu(torch.randn(B, p.C, p.H, p.W, device="cuda"))
            dy = torch.randn(B, p.M, p.Ho, p.Wo, device="cuda")
            w_size = (p.M, p.C, p.R, p.S)
            ref = conv2d_weight(x.double(), w_size, dy.double(), padding=1)
            for tf32 in (False, True):
                torch.backends.cudnn.allow_tf32 = tf32
                got = conv2d_weight(x, w_size, dy, padding=1)
                rows.append((preset, "cudnn-" + ("tf32" if tf32 else "fp32"), *errors(got, ref)))
            torch.backends.cudnn.allow_tf32 = False
            done[preset] = (x, dy, ref)
        x, dy, ref = done[preset]
        problem = replace(p, op=Op.WGRAD)
        conv = Conv(problem, parse_variant_name(name))
        out = conv.run({Role.X: cupy.asarray(x), Role.DY: cupy.asarray(dy)})
        dw = torch.as_tensor(out[Role.DW], device="cuda")
        rows.append((preset, name, *errors(dw, ref)))
    print(f"fp32 wgrad against float64, B={args.batch}, {torch.cuda.get_device_name()}")
    print(f"{'layer':9} {'kernel':52} {'rel L2':>10} {'bias':>10}")
    for preset, name, rel, bias in rows:
        print(f"{preset:9} {name:52} {rel:10.2e} {bias:10.2e}")


if __name__ == "__main__":
    main()
