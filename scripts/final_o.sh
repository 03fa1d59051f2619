#!/bin/bash
# The twenty-fourth session's GPU calls (2026-11-24), after mmahwc's stacked rows:
# STEP=a: verify every preset's default sets (all ops), then the GPU tier's drawn problems
# (PART=3); STEP=final: verify, the new winner, tier parts 1 and 3; STEP=best: bench --best on the presets whose winners changed; STEP=tier: the
# GPU tier, PART=1, 3 or 4 (scripts/final_a.sh).  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
case "${STEP:-a}" in
  a)
    timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
    tail -2 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head
    LIMIT=${LIMIT:-380} PART=3 bash scripts/final_a.sh
    ;;
  best)
    for so in layer2-bf16:dgrad mx-layer2-bf16:fprop mx-layer2-bf16:dgrad mx-layer2:fprop mx-layer2:dgrad layer2:dgrad; do
      s=${so%%:*}; op=${so#*:}
      timeout 150 python3 -m specgen bench --shape $s --op $op --best > $OUT/best-$s-$op.log 2>&1; echo "bench --best $s $op rc=$?"
      grep -E "B=|^cudnn|^mm|^persist|^drow|^wtap|not timed" $OUT/best-$s-$op.log | cut -c1-170
    done
    ;;
  final)  # after the slices: verify, tier parts 1 and 3, and the new winner, in one call
    timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
    tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head
    timeout 100 python3 -m specgen bench --shape mx-layer1-bf16 --op dgrad --variant mmahwc_t18_r8x16_s8_v4_k2_bf16 --variant mmatoep_t24_r1x3_m1_bf16 > $OUT/best-mx-layer1-bf16-dgrad.log 2>&1; echo "bench rc=$?"
    grep -E "B=|^cudnn|^mm|not timed" $OUT/best-mx-layer1-bf16-dgrad.log | cut -c1-150
    LIMIT=${L1:-150} PART=1 bash scripts/final_a.sh
    LIMIT=${L3:-330} PART=3 bash scripts/final_a.sh
    ;;
  tier) LIMIT=${LIMIT:-560} PART=$PART bash scripts/final_a.sh ;;
esac
