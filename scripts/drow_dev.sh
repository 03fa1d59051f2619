#!/bin/bash
# drow (fp32 dgrad, a lane a dx row) on the 7x7 layers at B=10000: verify on every
# preset and on padded, rectangular and tiny problems, then images, maps a stage and
# ring depths beside the shipped winner (listed first) and cuDNN in the same run (L1,
# L2, M1, M2 replace a preset's list, without the drow_ prefix and _fp32_dgrad suffix).
# Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/drow-dev.log
for s in ${VERIFY-layer1 layer2 mx-layer1 mx-layer2 ae-enc1 ae-dec3 C=3,M=5,H=11,W=13,K=3,pad=1 C=2,M=3,H=9,W=12,K=3x5,pad=1x2 C=3,M=4,H=10,W=11,K=4,pad=same C=2,M=4,H=8,W=7,K=3,pad=4 C=3,M=6,H=5,W=6,K=7,pad=3}; do
  timeout 120 python3 -m specgen verify --shape $s --op dgrad --strategy drow >> $LOG 2>&1; echo "verify $s rc=$?"
done
b() { [ -n "$NOBENCH" ] && return; s=$1; w=$2; shift 2; args=(--variant $w); for v in "$@"; do args+=(--variant drow_${v}_fp32_dgrad); done
  timeout 240 python3 -m specgen bench --shape $s --op dgrad "${args[@]}" >> $LOG 2>&1; echo "bench $s rc=$?"; }
b layer1 stream_t22_m1_c4_r1x12_fp32_dgrad ${L1-n16_m2_q3_x1_b1 n32_m2_q3_x2_b1 n16_m2_q3_x2_b1 n32_m1_q3_x2_b1 n16_m4_q3_x2_b1 n32_m2_q4_x2_b1}
b layer2 stream_t40_m4_c2_r4x8_fp32_dgrad ${L2-n8_m8_q3_x1_b1 n8_m8_q4_x1_b1 n8_m8_q3_x2_b1 n4_m8_q3_x2_b1 n8_m4_q3_x2_b1}
b mx-layer1 stream_t36_m1_c2_r1x12_fp32_dgrad ${M1-n32_m4_q3_x1_b1 n32_m4_q3_x2_b1 n32_m2_q3_x2_b1 n16_m4_q3_x2_b1 n16_m6_q3_x2_b1 n32_m3_q3_x2_b1}
b mx-layer2 persist_t11_r6x3_fp32_dgrad ${M2-n4_m8_q3_x1_b1 n4_m8_q4_x1_b1 n2_m8_q3_x1_b1 n4_m8_q3_x2_b1 n2_m12_q3_x2_b1 n4_m4_q3_x1_b1}
grep -E "B=|^cudnn-fp32|^drow|^stream|^persist|not timed|rror|FAIL" $LOG | cut -c1-140
# Nsight Compute on PROF="preset:variant ..." (a timed launch at the preset's batch, after verify's),
# with the issue stalls per instruction
for pv in $PROF; do s=${pv%%:*}; v=${pv#*:}
  timeout 200 ncu --kernel-name regex:drow --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 -m specgen bench --shape $s --op dgrad --variant drow_${v}_fp32_dgrad > $OUT/drow-prof-$s.log 2>&1; echo "ncu $s rc=$?"
  grep -E "Duration|Throughput|Issue Slots|Wavefront|Bank|Registers|Achieved Occ|Eligible|Block Limit|highest-util" $OUT/drow-prof-$s.log | head -30
  grep -E "issue_stalled" $OUT/drow-prof-$s.log | awk '$NF > 0.05' | head -20
done
