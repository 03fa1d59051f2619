#!/bin/bash
# Tune the autoencoder's wide bf16 presets on the GPU present: tcwgrad's wgrad, wgmma's
# forward and dgrad (logs under $OUT; the winners go to specgen/winners.json by hand,
# with their figures in BENCHMARKS.md).
export PYTHONPATH=.
t() { timeout ${LIMIT:-100} python3 -m specgen tune --budget ${BUDGET:-24} "$@" 2>&1 | grep -v "verified/timed" | tail -8; }
for s in ae-enc2-bf16 ae-dec2-bf16; do t --shape $s --op wgrad --strategy tcwgrad; done
for s in ae-dec2-bf16 ae-enc2-bf16; do t --shape $s --strategy wgmma; done
for s in ae-enc2-bf16 ae-dec2-bf16; do t --shape $s --op dgrad --strategy wgmma; done
