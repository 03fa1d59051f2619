#!/bin/bash
# The twenty-fifth session's closing GPU call (2026-11-25), after mmahwc's deeper stacks and
# stacked fit: verify every preset's default sets (all ops), bench --best on the presets
# whose winners changed, then the GPU tier's drawn problems (PART=3) and presets (PART=1).
# Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head
for so in layer2-bf16:dgrad mx-layer1-bf16:dgrad mx-layer2-bf16:dgrad layer2:dgrad mx-layer2:dgrad; do
  s=${so%%:*}; op=${so#*:}
  timeout 60 python3 -m specgen bench --shape $s --op $op --best > $OUT/best-$s-$op.log 2>&1; echo "bench --best $s $op rc=$?"
  grep -E "^cudnn-(bf16|tf32)|^mm|^drow|not timed" $OUT/best-$s-$op.log | cut -c1-120
done
LIMIT=${L3:-280} PART=3 bash scripts/final_a.sh
LIMIT=${L1:-100} PART=1 bash scripts/final_a.sh
