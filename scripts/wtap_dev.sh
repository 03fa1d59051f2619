#!/bin/bash
# wtap (fp32 wgrad, a lane per (channel, map, window row)) on the 7x7 layers at
# B=10000: verify the default set's wtap kernels on every preset, and each listed
# variant at a batch that gives every slice several images (so a ring's buffers turn
# over), then bench them beside the shipped winner (listed first) and cuDNN in the same
# run.  L1, L2, M1, M2 replace a preset's list (names without the wtap_ prefix and the
# _fp32_wgrad suffix; an empty list skips the preset); E2 and D2 are ae-enc2's and
# ae-dec2's (B=128, the shipped wgemm winner first; empty unless set); NOBENCH=1 verifies only;
# PROF="preset:name ..." profiles those with Nsight Compute.  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/wtap-dev.log
for s in ${VERIFY-layer1 layer2 mx-layer1 mx-layer2 ae-enc1 ae-dec3 ae-dec1}; do
  timeout 120 python3 -m specgen verify --shape $s --op wgrad --strategy wtap >> $LOG 2>&1; echo "verify $s rc=$?"
done
L1=${L1-t16_m4_c1_p4_r1x1_w8_q2_s1056 t16_m4_c1_p4_r1x1_w8_q3_s1056 t16_m4_c1_p4_r1x1_w4_q3_s1056 t10_m4_c1_p4_r1x1_w8_q3_s1056}
L2=${L2-t12_m16_c4_p4_r1x1_w1_q2_s1056 t11_m16_c4_p4_r1x1_w1_q3_s1056 t9_m16_c4_p4_r1x1_w1_q3_s1056 t12_m8_c4_p4_r1x1_w1_q3_s528}
M1=${M1-t22_m4_c1_p4_r1x1_w4_q2_s1056 t22_m4_c1_p4_r1x1_w8_q2_s1056 t22_m4_c1_p4_r1x1_w8_q3_s1056 t11_m4_c1_p4_r1x1_w8_q3_s1056 t11_m12_c1_p4_r1x1_w8_q3_s352}
M2=${M2-t14_m24_c4_p4_r1x1_w1_q2_s352 t9_m24_c3_p4_r1x1_w1_q2_s264 t9_m24_c4_p4_r1x1_w1_q3_s352 t9_m24_c3_p4_r1x1_w1_q3_s264 t14_m24_c3_p4_r1x1_w1_q3_s264}
v() { [ $# -lt 3 ] && return; s=$1; b=$2; shift 2; for n in "$@"; do
  timeout 100 python3 -m specgen verify --shape $s --op wgrad --batch $b --variant wtap_${n}_fp32_wgrad >> $LOG 2>&1; echo "verify $s $n B=$b rc=$?"; done; }
v layer1 2200 $L1; v layer2 2200 $L2; v mx-layer1 2200 $M1; v mx-layer2 800 $M2; v ae-enc2 128 $E2; v ae-dec2 128 $D2
b() { [ -n "$NOBENCH" ] || [ $# -lt 2 ] && return; s=$1; shift; args=(); for n in "$@"; do args+=(--variant wtap_${n}_fp32_wgrad); done
  timeout 240 python3 -m specgen bench --shape $s --op wgrad "${args[@]}" >> $LOG 2>&1; echo "bench $s rc=$?"; }
b layer1 $L1; b layer2 $L2; b mx-layer1 $M1; b mx-layer2 $M2
w() { [ -n "$NOBENCH" ] || [ $# -lt 2 ] && return; s=$1; shift; args=(--variant wgemm_b128x128_k8_s29_fp32_wgrad); for n in "$@"; do args+=(--variant wtap_${n}_fp32_wgrad); done
  timeout 240 python3 -m specgen bench --shape $s --op wgrad "${args[@]}" >> $LOG 2>&1; echo "bench $s rc=$?"; }
w ae-enc2 $E2; w ae-dec2 $D2
grep -E "B=|^cudnn-fp32|^cudnn-tf32|^wtap|^wgemm|not timed|rror|FAIL|passed|failed" $LOG | cut -c1-150
# Nsight Compute on PROF="preset:name ..." (a timed launch at the preset's batch, after
# verify's), with the issue stalls per instruction
for pv in $PROF; do s=${pv%%:*}; n=${pv#*:}
  timeout 200 ncu --kernel-name regex:wgrad$ --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 -m specgen bench --shape $s --op wgrad --variant wtap_${n}_fp32_wgrad > $OUT/wtap-prof-$s-$n.log 2>&1; echo "ncu $s $n rc=$?"
  grep -E "Duration|Issue Slots|Registers|Achieved Occ|Eligible|No Eligible|Block Limit (Sh|Reg)" $OUT/wtap-prof-$s-$n.log | head -12
  grep -E "issue_stalled" $OUT/wtap-prof-$s-$n.log | awk '$NF > 0.05' | head -20
done
