#!/bin/bash
# The twenty-second session's GPU calls (2026-11-24).  Logs under $OUT.
#   STEP=a   mmahwc's tune space on the three problems it leads (layer2-bf16 and
#            mx-layer2-bf16 forward, mx-layer2-bf16 dgrad), verify --all-shapes --op all
#   STEP=b   the shipped winners benched (bench --best) on those three, GPU tier part 3
#   STEP=tier GPU tier part 1 (the presets' default sets, the 7x7 layers at B=1000)
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
case "${STEP:-a}" in
  a)
    for so in layer2-bf16:fprop mx-layer2-bf16:fprop mx-layer2-bf16:dgrad; do s=${so%%:*}; op=${so#*:}
      timeout 170 python3 -m specgen tune --shape $s --op $op --strategy mmahwc --budget ${BUDGET:-24} > $OUT/tune-mmahwc-$s-$op.log 2>&1
      echo "tune $s $op rc=$?"; tail -6 $OUT/tune-mmahwc-$s-$op.log | cut -c1-160
    done
    timeout 150 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep FAIL $OUT/verify-all.log | head ;;
  b)
    for so in layer2-bf16:fprop mx-layer2-bf16:fprop mx-layer2-bf16:dgrad; do s=${so%%:*}; op=${so#*:}
      timeout 150 python3 -m specgen bench --shape $s --op $op --best > $OUT/bench-best-$s-$op.log 2>&1
      echo "bench $s $op rc=$?"; grep -E "B=|^cudnn|^mma" $OUT/bench-best-$s-$op.log | cut -c1-160
    done
    LIMIT=330 PART=3 bash scripts/final_a.sh ;;
  tier)
    LIMIT=580 PART=1 bash scripts/final_a.sh ;;
esac
