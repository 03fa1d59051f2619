#!/bin/bash
# The twenty-third session's GPU calls (2026-11-24), after mmahwc's shifts and tf32:
# STEP=a: verify every preset's default sets (all ops), then bench --best on the presets
# whose winners changed and the variants around them; STEP=tier: the GPU tier, PART=1 or
# 3 (scripts/final_a.sh).  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
case "${STEP:-a}" in
  a)
    timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
    tail -2 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head
    for so in layer2:fprop mx-layer2:fprop layer2-bf16:fprop layer2-bf16:dgrad mx-layer2-bf16:fprop mx-layer2-bf16:dgrad; do
      s=${so%%:*}; op=${so#*:}
      timeout 150 python3 -m specgen bench --shape $s --op $op --best > $OUT/best-$s-$op.log 2>&1; echo "bench --best $s $op rc=$?"
      grep -E "B=|^cudnn|^mm|^persist|^drow|not timed" $OUT/best-$s-$op.log | cut -c1-170
    done
    timeout 150 python3 -m specgen bench --shape layer2-bf16 --op dgrad --variant mmahwc_t20_r16x64_s4_v1_bf16 --variant mmahwc_t20_r16x48_s4_v1_bf16 --variant mmatoep_t40_r2x3_m4_bf16 > $OUT/bench-l2d.log 2>&1; echo "bench l2 dgrad rc=$?"
    grep -E "^mm|not timed" $OUT/bench-l2d.log | cut -c1-170
    timeout 150 python3 -m specgen bench --shape mx-layer2 --op dgrad --variant mmapersist_t13_r16x64_tf32 --variant mmahwc_t17_r16x96_s1_v1_tf32 --variant mmahwc_t11_r16x96_s1_v1_tf32 > $OUT/bench-m2d-tf32.log 2>&1; echo "bench mx-layer2 tf32 dgrad rc=$?"
    grep -E "^cudnn-tf32|^mm|not timed" $OUT/bench-m2d-tf32.log | cut -c1-170
    ;;
  tier) LIMIT=${LIMIT:-560} PART=$PART bash scripts/final_a.sh ;;
esac
