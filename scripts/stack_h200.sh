#!/bin/bash
# Twenty-fourth session, on the H200: mmahwc's stacks beside the shipped winners of each
# problem they serve, cuDNN in the same run (`specgen bench --variant ...`, B=10000, each
# verified before it is timed).  Log under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=$OUT/stack-h200.log
b() { s=$1; op=$2; shift 2; a=(); for n in "$@"; do a+=(--variant $n); done
  timeout 150 python3 -m specgen bench --shape $s --op $op "${a[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"; }
b layer2-bf16 dgrad mmahwc_t20_r16x48_s4_v1_k1_bf16 mmahwc_t20_r8x16_s2_v4_k1_bf16 mmahwc_t20_r8x32_s2_v4_k1_bf16 mmahwc_t40_r16x16_s4_v4_k1_bf16 mmahwc_t40_r8x16_s2_v4_k1_bf16
b mx-layer2-bf16 fprop mmahwc_t14_r24x80_s1_v1_k1_bf16 mmahwc_t27_r24x16_s1_v3_k1_bf16 mmahwc_t9_r24x16_s1_v3_k1_bf16
b mx-layer2-bf16 dgrad mmahwc_t11_r16x96_s1_v1_k1_bf16 mmahwc_t33_r16x16_s1_v3_k1_bf16 mmahwc_t11_r16x16_s1_v3_k1_bf16
b mx-layer1-bf16 dgrad mmatoep_t24_r1x3_m1_bf16 mmahwc_t18_r8x16_s8_v4_k1_bf16 mmahwc_t24_r8x16_s8_v4_k1_bf16
b mx-layer2 fprop mmahwc_t9_r24x80_s1_v1_k1_tf32 mmahwc_t27_r24x16_s1_v4_k1_tf32 mmahwc_t27_r24x16_s1_v3_k1_tf32 mmahwc_t9_r24x16_s1_v3_k1_tf32
b mx-layer2 dgrad mmahwc_t17_r16x96_s1_v1_k1_tf32 mmahwc_t17_r16x16_s1_v3_k1_tf32 mmahwc_t11_r16x16_s1_v3_k1_tf32
b layer2 dgrad mmahwc_t10_r8x64_s2_v1_k1_tf32 mmahwc_t8_r8x16_s2_v4_k1_tf32 mmahwc_t20_r8x16_s2_v4_k1_tf32 mmahwc_t12_r8x16_s2_v4_k1_tf32
grep -E "B=|^cudnn|^mma|FAIL|rror" $LOG | cut -c1-150
