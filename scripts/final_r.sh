#!/bin/bash
# The twenty-sixth session's closing GPU calls (2026-11-25), after wgmma's TMA feed.
# STEP=c: bench --best of the wide bf16 presets (forward and dgrad), the same layers in
# fp16 (`--batch 128`, the TMA default's tile), then the GPU tier's drawn problems
# (PART=3).  STEP=d: the tier's long reductions and streamed batches (PART=4).  Logs
# under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ "${STEP:-c}" = c ]; then
for s in ae-enc2-bf16 ae-dec2-bf16; do for op in fprop dgrad; do
  timeout 60 python3 -m specgen bench --shape $s --op $op --best > $OUT/best-$s-$op.log 2>&1; echo "bench --best $s $op rc=$?"
  grep -E "^cudnn-bf16|^wg|not timed" $OUT/best-$s-$op.log | cut -c1-130
done; done
for spec in C=256,M=128 C=128,M=256; do for op in fprop dgrad; do
  timeout 60 python3 -m specgen bench --shape "$spec,H=16,W=16,K=3,pad=1,dtype=fp16,layout=nhwc" --op $op --batch 128 --variant wgmma_b256x128_p3_q1_gr_tma_fp16 > $OUT/fp16-$op-${spec//[=,]/}.log 2>&1
  echo "fp16 $spec $op rc=$?"; grep -E "^cudnn-fp16|^wg|not timed" $OUT/fp16-$op-${spec//[=,]/}.log | cut -c1-130
done; done
LIMIT=${L3:-420} PART=3 bash scripts/final_a.sh
else
LIMIT=${L4:-560} PART=4 bash scripts/final_a.sh
fi
