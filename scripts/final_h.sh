#!/bin/bash
# The GPU checks after drow (fp32 dgrad, a lane a dx row; 2026-11-24) and, with OP=wgrad
# (scripts/final_i.sh), after wtap's third pass, in calls that fit a device call:
#   STEP=check  specgen verify --all-shapes --op all, then the 7x7 presets' fp32 OP
#               (dgrad unless set) shipped winners benched beside cuDNN (bench --best)
#   STEP=tier   GPU tier part 1 (presets' default sets and winners)
#   STEP=drawn  GPU tier part 3 (drawn problems, the backward ops among them)
# Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
OP=${OP:-dgrad}
case "${STEP:-check}" in
  check)
    timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | head -5 | cut -c1-200
    mkdir -p $OUT/json
    for s in layer1 layer2 mx-layer1 mx-layer2; do
      timeout 60 python3 -m specgen bench --shape $s --op $OP --best --json $OUT/json/bench-$s-$OP.json >> $OUT/bench-$OP-best.log 2>&1
      echo "bench $s $OP rc=$?"
    done
    (cd $OUT && tar czf bench-$OP-best-json.tgz json && rm -rf json)
    grep -E "B=|^cudnn|^drow|^wtap|^mma|not timed" $OUT/bench-$OP-best.log | cut -c1-118 ;;
  tier)
    LIMIT=560 PART=1 bash scripts/final_a.sh ;;
  drawn)
    LIMIT=560 PART=3 bash scripts/final_a.sh ;;
esac
