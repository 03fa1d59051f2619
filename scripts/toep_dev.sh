#!/bin/bash
# mmatoep on the H200: its default kernels of the 16-bit 7x7 presets' dgrad and forward
# passes verified against the float64 reference, then variants benched beside cuDNN
# bf16 and the shipped winners (mmafold, mmastrip) at B=10000.  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/toep-dev.log
for s in layer1-bf16 layer2-bf16 mx-layer1-bf16 mx-layer2-bf16; do
  for op in dgrad fprop; do
    timeout 60 python3 -m specgen verify --shape $s --op $op --strategy mmatoep >> $OUT/toep-verify.log 2>&1
    echo "verify $s $op rc=$?"
  done
done
grep -E "mmatoep" $OUT/toep-verify.log | cut -c1-150
b() { s=$1; tag=$2; shift 2; args=(); for v in "$@"; do args+=(--variant ${v}${tag}); done
  op=${tag#_}; op=${op%_iobf16}; [ "$op" = iobf16 ] && op=fprop
  timeout 150 python3 -m specgen bench --shape $s --op $op "${args[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"; }
T=mmatoep_
D=_dgrad_iobf16
b layer1-bf16 $D mmafold_t22_r1x2_yd_j8_bf16 ${T}t43_r1x11_m1_bf16 ${T}t43_r1x6_m1_bf16 ${T}t43_r1x3_m1_bf16 ${T}t43_r1x2_m1_bf16 ${T}t86_r1x6_m1_bf16 ${T}t86_r1x3_m1_bf16 ${T}t29_r1x3_m1_bf16
b layer2-bf16 $D mmafold_t20_r4x4_yd_j2_bf16 ${T}t20_r1x5_m4_bf16 ${T}t20_r2x3_m4_bf16 ${T}t40_r1x5_m4_bf16 ${T}t40_r2x3_m4_bf16 ${T}t40_r2x2_m4_bf16 ${T}t40_r1x3_m4_bf16 ${T}t20_r1x3_m4_bf16
b mx-layer1-bf16 $D mmafold_t24_r1x1_yd_j8_bf16 ${T}t24_r1x3_m1_bf16 ${T}t36_r1x2_m1_bf16 ${T}t36_r1x3_m1_bf16 ${T}t24_r1x2_m1_bf16 ${T}t18_r1x3_m1_bf16 ${T}t24_r1x5_m1_bf16
b mx-layer2-bf16 $D mmafold_t11_r12x2_yd_j2_bf16 ${T}t33_r2x5_m12_bf16 ${T}t17_r2x5_m12_bf16 ${T}t33_r4x3_m12_bf16
b layer2-bf16 _iobf16 mmastrip_t34_r16x4_yd_bf16 ${T}t34_r4x3_m16_bf16 ${T}t34_r2x5_m16_bf16 ${T}t17_r4x3_m16_bf16 ${T}t34_r4x2_m16_bf16 ${T}t34_r2x3_m16_bf16
grep -E "B=|^cudnn|^mma|not timed|rror" $LOG | cut -c1-125
