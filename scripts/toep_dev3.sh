#!/bin/bash
# mmatoep's dgrad of layer2 and mx-layer1 in bf16 at B=10000: more register tiles and bands
# (bands whose tiles waste fewer rows) beside the shipped winners and cuDNN bf16.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/toep-dev3.log
b() { s=$1; shift; args=(); for v in "$@"; do args+=(--variant mmatoep_${v}_bf16_dgrad_iobf16); done
  timeout 200 python3 -m specgen bench --shape $s --op dgrad "${args[@]}" >> $LOG 2>&1; echo "bench $s rc=$?"; }
b layer2-bf16 t40_r2x3_m4 t40_r4x1_m4 t40_r4x2_m4 t40_r2x1_m4 t40_r1x2_m4 t20_r2x2_m4 t27_r2x3_m4 t27_r2x2_m4
b mx-layer1-bf16 t24_r1x3_m1 t24_r1x1_m1 t36_r1x1_m1 t29_r1x3_m1 t32_r1x3_m1 t29_r1x2_m1
grep -E "B=|^cudnn|^mma|not timed|rror" $LOG | cut -c1-125
