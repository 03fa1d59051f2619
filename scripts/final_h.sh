#!/bin/bash
# The GPU checks after drow (fp32 dgrad, a lane a dx row; 2026-11-24), in calls that fit
# a device call:
#   STEP=check  specgen verify --all-shapes --op all, then the 7x7 presets' fp32 dgrad
#               shipped winners benched beside cuDNN (specgen bench --best)
#   STEP=tier   GPU tier part 1 (presets' default sets: drow's default and winners)
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
      timeout 60 python3 -m specgen bench --shape $s --op dgrad --best --json $OUT/json/bench-$s-dgrad.json >> $OUT/bench-dgrad-best.log 2>&1
      echo "bench $s dgrad rc=$?"
    done
    (cd $OUT && tar czf bench-dgrad-best-json.tgz json && rm -rf json)
    grep -E "B=|^cudnn|^drow|^mma|not timed" $OUT/bench-dgrad-best.log | cut -c1-118 ;;
  tier)
    LIMIT=560 PART=1 bash scripts/final_a.sh ;;
  drawn)
    LIMIT=560 PART=3 bash scripts/final_a.sh ;;
esac
