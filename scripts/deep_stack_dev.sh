#!/bin/bash
# Twenty-fifth session: mmahwc stacks of 5 to 8 output rows (more reuse of each input
# row's ldmatrix and each B fragment), benched beside the shipped winners
# (`specgen bench --variant ...`, B=10000, cuDNN in the same run).  Log under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=$OUT/deep-stack-dev-${STEP:-1}.log
b() { s=$1; op=$2; shift 2; a=(); for n in "$@"; do a+=(--variant $n); done
  timeout 200 python3 -m specgen bench --shape $s --op $op "${a[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"; }
if [ "${STEP:-1}" = 1 ]; then
b mx-layer1-bf16 dgrad mmahwc_t18_r8x16_s8_v4_k2_bf16 mmahwc_t18_r8x16_s8_v6_k2_bf16 mmahwc_t18_r8x16_s8_v6_k3_bf16 mmahwc_t18_r8x16_s8_v6_k4_bf16 mmahwc_t24_r8x16_s8_v8_k2_bf16 mmahwc_t24_r8x16_s8_v8_k3_bf16 mmahwc_t24_r8x16_s8_v8_k4_bf16 mmahwc_t24_r8x16_s8_v6_k2_bf16 mmahwc_t36_r8x16_s8_v6_k2_bf16 mmahwc_t36_r8x16_s8_v6_k3_bf16 mmahwc_t15_r8x16_s8_v5_k2_bf16
b layer2-bf16 dgrad mmahwc_t20_r8x16_s2_v4_k1_bf16 mmahwc_t20_r8x16_s2_v5_k1_bf16 mmahwc_t20_r8x16_s2_v6_k1_bf16 mmahwc_t40_r8x16_s2_v8_k1_bf16
b layer2 dgrad mmahwc_t20_r8x16_s2_v4_k1_tf32 mmahwc_t20_r8x16_s2_v5_k1_tf32 mmahwc_t20_r8x16_s2_v6_k1_tf32 mmahwc_t20_r8x16_s2_v5_k2_tf32
b mx-layer2-bf16 dgrad mmahwc_t33_r16x16_s1_v3_k1_bf16 mmahwc_t33_r8x16_s1_v4_k1_bf16 mmahwc_t33_r8x16_s1_v6_k1_bf16 mmahwc_t33_r8x16_s1_v8_k1_bf16
elif [ "${STEP}" = 3 ]; then
# the third round, run on a trial change not kept (2026-11-25): the slices' sums in one slot of
# shared memory, added in turn from the last slice down, so that more slices keep two blocks an SM
b mx-layer1-bf16 dgrad mmahwc_t18_r8x16_s8_v6_k3_bf16 mmahwc_t18_r8x16_s8_v6_k4_bf16 mmahwc_t18_r8x16_s8_v6_k5_bf16 mmahwc_t18_r8x16_s8_v4_k4_bf16 mmahwc_t18_r8x16_s8_v4_k3_bf16 mmahwc_t24_r8x16_s8_v6_k4_bf16
b layer2 dgrad mmahwc_t20_r8x16_s2_v5_k3_tf32 mmahwc_t20_r8x16_s2_v5_k4_tf32
b layer2-bf16 dgrad mmahwc_t20_r8x16_s2_v5_k2_bf16 mmahwc_t20_r8x16_s2_v5_k3_bf16
else
# the second round: around the first round's gains
b layer2-bf16 dgrad mmahwc_t20_r8x16_s2_v5_k1_bf16 mmahwc_t20_r8x16_s2_v5_k2_bf16 mmahwc_t40_r8x16_s2_v5_k1_bf16 mmahwc_t40_r8x16_s2_v8_k2_bf16 mmahwc_t40_r8x16_s2_v7_k1_bf16 mmahwc_t20_r8x32_s2_v5_k1_bf16 mmahwc_t20_r16x16_s4_v5_k1_bf16
b layer2 dgrad mmahwc_t20_r8x16_s2_v5_k2_tf32 mmahwc_t20_r8x16_s2_v5_k3_tf32 mmahwc_t20_r8x16_s2_v4_k2_tf32 mmahwc_t20_r8x16_s2_v6_k2_tf32 mmahwc_t20_r8x16_s2_v5_k4_tf32 mmahwc_t10_r8x16_s2_v5_k2_tf32
b mx-layer1-bf16 dgrad mmahwc_t18_r8x16_s8_v6_k3_bf16 mmahwc_t36_r8x16_s8_v6_k4_bf16 mmahwc_t18_r8x16_s8_v6_k6_bf16 mmahwc_t24_r8x16_s8_v6_k3_bf16 mmahwc_t36_r8x16_s8_v4_k3_bf16 mmahwc_t18_r8x16_s8_v7_k3_bf16 mmahwc_t36_r8x16_s8_v7_k3_bf16
b mx-layer2-bf16 dgrad mmahwc_t33_r16x16_s1_v3_k1_bf16 mmahwc_t33_r16x16_s1_v4_k1_bf16 mmahwc_t33_r16x16_s1_v4_k2_bf16 mmahwc_t33_r16x16_s1_v5_k1_bf16
b mx-layer2 dgrad mmahwc_t17_r16x16_s1_v3_k1_tf32 mmahwc_t11_r16x16_s1_v4_k1_tf32 mmahwc_t11_r16x16_s1_v6_k1_tf32
fi
grep -E "FAIL|rror" $LOG | cut -c1-200 | head
grep -E "B=|^cudnn|^mm|not timed" $LOG | cut -c1-150
