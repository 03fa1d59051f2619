#!/bin/bash
# Twenty-fourth session: mmahwc's slices of the k steps (`k<G>`: G warps share a stack's
# tiles, each taking every G-th k step, their sums added in shared memory), verified on a
# drawn-like problem, then benched beside the shipped winners (`specgen bench --variant ...`,
# B=10000, cuDNN in the same run).  Log under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=$OUT/slice-dev.log
for sv in "C=12,M=1,H=20,W=22,K=7,pad=6,dtype=bf16:mmahwc_t9_r8x16_s8_v4_k3_bf16" \
  "C=12,M=24,H=17,W=17,K=7,bias=1,act=relu,dtype=fp16:mmahwc_t8_r24x16_s1_v4_k2_fp16" \
  "C=16,M=4,H=20,W=21,K=7,pad=6:mmahwc_t6_r16x16_s4_v2_k4_tf32"; do
  s=${sv%%:*}; n=${sv#*:}
  timeout 120 python3 -m specgen verify --shape "$s" --variant $n >> $LOG 2>&1; echo "verify $s $n rc=$?"
done
b() { s=$1; op=$2; shift 2; a=(); for n in "$@"; do a+=(--variant $n); done
  timeout 200 python3 -m specgen bench --shape $s --op $op "${a[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"; }
b mx-layer1-bf16 dgrad mmatoep_t24_r1x3_m1_bf16 mmahwc_t18_r8x16_s8_v4_k1_bf16 mmahwc_t18_r8x16_s8_v4_k2_bf16 mmahwc_t18_r8x16_s8_v4_k4_bf16 mmahwc_t12_r8x16_s8_v4_k4_bf16 mmahwc_t12_r8x16_s8_v4_k3_bf16 mmahwc_t24_r8x16_s8_v4_k3_bf16 mmahwc_t18_r8x16_s8_v3_k4_bf16 mmahwc_t18_r8x16_s8_v2_k4_bf16 mmahwc_t36_r8x16_s8_v4_k2_bf16
b layer2-bf16 dgrad mmahwc_t20_r8x16_s2_v4_k1_bf16 mmahwc_t20_r8x16_s2_v4_k2_bf16 mmahwc_t40_r8x16_s2_v4_k2_bf16
b mx-layer2-bf16 fprop mmahwc_t27_r24x16_s1_v3_k1_bf16 mmahwc_t27_r24x16_s1_v3_k2_bf16 mmahwc_t9_r24x16_s1_v3_k2_bf16
grep -E "FAIL|rror" $LOG | cut -c1-200 | head
grep -E "B=|^cudnn|^mm|not timed" $LOG | cut -c1-150
