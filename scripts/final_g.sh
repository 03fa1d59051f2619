#!/bin/bash
# The GPU checks after wtap (2026-11-24), in calls that fit a device call:
#   STEP=new    the backward tests that reach wtap (every preset's wgrad default set at its
#               default batch, the drawn backward problems), then the 7x7 presets' fp32
#               wgrad shipped winners benched beside cuDNN (specgen bench --best)
#   STEP=verify specgen verify --all-shapes --op all
#   STEP=tier   GPU tier part 1 (presets' default sets, long reductions)
# Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
case "${STEP:-new}" in
  new)
    timeout 330 python3 -m pytest -q -m gpu tests/test_gpu.py \
      -k "wgrad_at_the_default_batch or random_backward" -p no:cacheprovider > $OUT/wtap-gpu-tests.log 2>&1
    echo "gpu tests rc=$?"; tail -3 $OUT/wtap-gpu-tests.log | cut -c1-300
    mkdir -p $OUT/json
    for s in layer1 layer2 mx-layer1 mx-layer2; do
      timeout 60 python3 -m specgen bench --shape $s --op wgrad --best --json $OUT/json/bench-$s-wgrad.json >> $OUT/bench-wgrad-best.log 2>&1
      echo "bench $s wgrad rc=$?"
    done
    (cd $OUT && tar czf bench-wgrad-best-json.tgz json && rm -rf json)
    grep -E "B=|^cudnn|^w|not timed" $OUT/bench-wgrad-best.log | cut -c1-118 ;;
  verify)
    timeout 560 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | head -5 | cut -c1-200 ;;
  tier)
    LIMIT=560 PART=1 bash scripts/final_a.sh ;;
esac
