#!/bin/bash
# The GPU checks after wtap's row splits a lane a sum, its mbarrier ring and its last
# step cut to the row (fp32 wgrad; 2026-11-24), in calls that fit a device call:
#   STEP=check  specgen verify --all-shapes --op all, then the 7x7 presets' fp32 wgrad
#               shipped winners benched beside cuDNN (specgen bench --best)
#   STEP=tier   GPU tier part 1 (presets' default sets: wtap's defaults and winners)
#   STEP=drawn  GPU tier part 3 (drawn problems, the backward ops among them)
# Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
case "${STEP:-check}" in
  check)
    timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | head -5 | cut -c1-200
    mkdir -p $OUT/json
    for s in layer1 layer2 mx-layer1 mx-layer2; do
      timeout 60 python3 -m specgen bench --shape $s --op wgrad --best --json $OUT/json/bench-$s-wgrad.json >> $OUT/bench-wgrad-best.log 2>&1
      echo "bench $s wgrad rc=$?"
    done
    (cd $OUT && tar czf bench-wgrad-best-json.tgz json && rm -rf json)
    grep -E "B=|^cudnn|^wtap|not timed" $OUT/bench-wgrad-best.log | cut -c1-118 ;;
  tier)
    LIMIT=560 PART=1 bash scripts/final_a.sh ;;
  drawn)
    LIMIT=560 PART=3 bash scripts/final_a.sh ;;
esac
