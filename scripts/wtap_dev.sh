#!/bin/bash
# wtap (fp32 wgrad, a lane per map and window row) on the 7x7 layers at B=10000: verify
# on every preset, then a few blocks, bands and steps beside the shipped winner (listed
# first) and cuDNN in the same run (L1, L2, M1, M2 replace a preset's list); Nsight
# Compute on layer1's default.  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/wtap-dev.log
for s in ${VERIFY-layer1 layer2 mx-layer1 mx-layer2 ae-enc1 ae-dec3 ae-dec1}; do
  timeout 120 python3 -m specgen verify --shape $s --op wgrad --strategy wtap >> $LOG 2>&1; echo "verify $s rc=$?"
done
b() { s=$1; w=$2; shift 2; args=(--variant $w); for v in "$@"; do args+=(--variant wtap_${v}_fp32_wgrad); done
  timeout 240 python3 -m specgen bench --shape $s --op wgrad "${args[@]}" >> $LOG 2>&1; echo "bench $s rc=$?"; }
b layer1 wtap_t16_m4_c1_p4_w4_s1056_fp32_wgrad ${L1-t16_m4_c1_p4_w8_s1056 t16_m4_c1_p4_w2_s1056 t20_m4_c1_p4_w4_s1056 t40_m4_c1_p4_w8_s1056 t16_m4_c1_p8_w4_s1056 t16_m4_c1_p4_w4_s528}
b layer2 wtap_t34_m16_c4_p4_w1_s1056_fp32_wgrad ${L2-t17_m16_c4_p4_w1_s1056 t12_m16_c4_p4_w1_s1056 t34_m8_c4_p4_w1_s1056 t34_m16_c2_p4_w1_s1056 t17_m16_c4_p8_w1_s1056}
b mx-layer1 wtap_t22_m12_c1_p4_w4_s1056_fp32_wgrad ${M1-t22_m12_c1_p4_w2_s1056 t17_m12_c1_p4_w4_s1056 t22_m12_c1_p8_w4_s1056 t22_m12_c1_p4_w4_s528}
b mx-layer2 wtap_t27_m24_c4_p4_w1_s352_fp32_wgrad ${M2-t27_m8_c6_p4_w1_s176 t14_m24_c4_p4_w1_s352 t27_m24_c2_p4_w1_s176 t27_m12_c4_p4_w1_s176 t27_m24_c4_p4_w1_s704}
grep -E "B=|^cudnn-fp32|^wtap|^wband|not timed|rror|FAIL" $LOG | cut -c1-140
# the profile: a timed launch of layer1's default at B=2000 (after verify's)
timeout 200 ncu --kernel-name regex:wtap --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section SchedulerStats \
  python3 -m specgen bench --shape layer1 --op wgrad --batch 2000 --variant wtap_t16_m4_c1_p4_w4_s1056_fp32_wgrad > $OUT/wtap-prof.log 2>&1; echo "ncu rc=$?"
grep -E "Duration|Throughput|Pipe|Issue|Wavefront|Bank|Registers|Achieved Occ|Stall|Eligible" $OUT/wtap-prof.log | head -60
