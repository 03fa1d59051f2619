#!/bin/bash
# The GPU checks after this session's wtap and drow changes (2026-11-24, nineteenth
# session), in calls that fit a device call:
#   STEP=check  specgen verify --all-shapes --op all; the shipped fp32 wgrad winners of
#               the 7x7 presets and the autoencoder's wide layers and the fp32 dgrad
#               winners of the 7x7 presets benched beside cuDNN (bench --best); Nsight
#               Compute on ae-enc2's wgrad winner
#   STEP=tier   GPU tier part 1 (presets' default sets and winners)
#   STEP=drawn  GPU tier part 3 (drawn problems, the backward ops among them)
# Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
case "${STEP:-check}" in
  check)
    timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | head -5 | cut -c1-200
    mkdir -p $OUT/json
    for so in layer1:wgrad layer2:wgrad mx-layer1:wgrad mx-layer2:wgrad ae-enc2:wgrad ae-dec2:wgrad \
              layer1:dgrad layer2:dgrad mx-layer1:dgrad mx-layer2:dgrad; do
      s=${so%%:*}; op=${so#*:}
      timeout 60 python3 -m specgen bench --shape $s --op $op --best --json $OUT/json/bench-$s-$op.json >> $OUT/bench-$op-best.log 2>&1
      echo "bench $s $op rc=$?"
    done
    (cd $OUT && tar czf bench-best-json.tgz json && rm -rf json)
    grep -hE "B=|^cudnn-fp32|^drow|^wtap|not timed" $OUT/bench-wgrad-best.log $OUT/bench-dgrad-best.log | cut -c1-118
    v=$(python3 -c "import json; print([n for n in json.load(open('specgen/winners.json'))['winners']['NVIDIA H200']['ae-enc2'] if n.startswith('wtap')][0])")
    timeout 150 ncu --kernel-name regex:wgrad$ --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      python3 -m specgen bench --shape ae-enc2 --op wgrad --variant $v > $OUT/wtap-prof-ae-enc2.log 2>&1
    echo "ncu rc=$?"
    grep -E "Duration|Issue Slots|FMA is|Registers Per|Achieved Occ|Eligible|No Eligible|Block Limit (Sh|Reg)" $OUT/wtap-prof-ae-enc2.log | head -12
    grep -E "issue_stalled" $OUT/wtap-prof-ae-enc2.log | awk '$NF > 0.05' | head -12 ;;
  tier)
    LIMIT=560 PART=1 bash scripts/final_a.sh ;;
  drawn)
    LIMIT=560 PART=3 bash scripts/final_a.sh ;;
esac
