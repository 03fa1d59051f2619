#!/bin/bash
# Twenty-fourth session: mmahwc's stacks across the presets' mmahwc problems (bf16 and tf32,
# forward and dgrad), each list beside the shipped winner, cuDNN in the same run.  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
b() { s=$1; op=$2; shift 2; a=(); for n in "$@"; do a+=(--variant $n); done
  timeout 150 python3 -m specgen bench --shape $s --op $op "${a[@]}" >> $OUT/stack-more.log 2>&1; echo "bench $s $op rc=$?"; }
b mx-layer2-bf16 fprop ${M2B-mmahwc_t27_r24x16_s1_v3_bf16 mmahwc_t27_r24x16_s1_v4_bf16 mmahwc_t27_r24x32_s1_v2_bf16 mmahwc_t27_r24x16_s1_v2_bf16 mmahwc_t14_r24x16_s1_v3_bf16}
b layer2-bf16 dgrad ${L2D-mmahwc_t20_r8x16_s2_v4_bf16 mmahwc_t20_r8x16_s2_v3_bf16 mmahwc_t40_r8x16_s2_v3_bf16 mmahwc_t14_r8x16_s2_v4_bf16}
b layer2 fprop ${L2T-mmahwc_t34_r32x64_s2_v1_tf32 mmahwc_t34_r16x16_s2_v4_tf32 mmahwc_t34_r32x16_s2_v4_tf32 mmahwc_t34_r16x32_s2_v2_tf32 mmahwc_t34_r32x32_s2_v2_tf32}
b mx-layer2 fprop ${M2T-mmahwc_t9_r24x80_s1_v1_tf32 mmahwc_t27_r24x16_s1_v3_tf32 mmahwc_t9_r24x16_s1_v3_tf32 mmahwc_t27_r24x16_s1_v4_tf32}
b layer2-bf16 fprop ${L2B-mmahwc_t34_r32x64_s2_v1_bf16 mmahwc_t34_r32x16_s2_v4_bf16 mmahwc_t34_r16x16_s2_v4_bf16 mmahwc_t34_r32x32_s2_v2_bf16}
b mx-layer2-bf16 dgrad ${M2D-mmahwc_t11_r16x96_s1_v1_bf16 mmahwc_t33_r16x16_s1_v3_bf16 mmahwc_t11_r16x16_s1_v4_bf16 mmahwc_t11_r16x32_s1_v2_bf16 mmahwc_t17_r16x16_s1_v3_bf16}
grep -E "B=|^cudnn|^mma|FAIL|rror" $OUT/stack-more.log | cut -c1-150
