#!/bin/bash
# mmafold on the H200: the GPU tests of 16-bit windows (forward and the dgrad views),
# the 16-bit 7x7 layers' dgrad (mmafold's default and variants) and forward (mmafold
# beside mmastrip's shipped winners) beside cuDNN bf16 at B=10000, and Nsight Compute's
# stall reasons of wstrip on layer2's wgrad.  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/fold-dev.log
timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py tests/test_wstrip.py -k "random_16bit or wstrip" -p no:cacheprovider > $OUT/fold-gpu-tests.log 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/fold-gpu-tests.log | cut -c1-300
b() { s=$1; op=$2; tag=$3; shift 3; args=(); for v in "$@"; do args+=(--variant ${v}${tag}); done
  timeout 100 python3 -m specgen bench --shape $s --op $op "${args[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"; }
b layer1-bf16 dgrad _dgrad_iobf16 mmafold_t32_r1x1_yd_j8_bf16 mmafold_t43_r1x1_yd_j8_bf16 mmafold_t22_r1x2_yd_j8_bf16 mmafold_t43_r1x2_yd_j8_bf16
b layer2-bf16 dgrad _dgrad_iobf16 mmafold_t32_r4x4_yd_j2_bf16 mmafold_t20_r4x4_yd_j2_bf16 mmafold_t20_r4x2_yd_j4_bf16 mmafold_t14_r4x1_yd_j8_bf16
b mx-layer1-bf16 dgrad _dgrad_iobf16 mmafold_t24_r1x1_yd_j8_bf16 mmafold_t18_r1x1_yd_j8_bf16 mmafold_t24_r1x3_yd_j8_bf16
b mx-layer2-bf16 dgrad _dgrad_iobf16 mmafold_t16_r12x4_yd_j2_bf16 mmafold_t17_r12x3_yd_j2_bf16 mmafold_t11_r12x2_yd_j2_bf16 mmafold_t9_r12x4_yd_j2_bf16
b layer1-bf16 fprop _iobf16 mmastrip_t80_r8x10_yd_bf16 mmafold_t80_r4x4_yd_j2_bf16
b mx-layer1-bf16 fprop _iobf16 mmastrip_t33_r16x6_ys_bf16 mmafold_t66_r12x4_yd_j2_bf16
b layer1-bf16 wgrad _wgrad_iobf16 wstrip_t40_r8x8_s264_bf16 wstrip_t80_r8x10_s132_bf16
b layer2-bf16 wgrad _wgrad_iobf16 wstrip_t17_r16x6_s264_bf16 wstrip_t17_r8x6_s264_bf16 wstrip_t12_r16x6_s264_bf16
b mx-layer1-bf16 wgrad _wgrad_iobf16 wstrip_t22_r16x8_s264_bf16
b mx-layer2-bf16 wgrad _wgrad_iobf16 wstrip_t27_r24x7_s132_bf16 wstrip_t27_r24x9_s132_bf16
grep -E "B=|^cudnn|^mma|^wstrip|not timed" $LOG | cut -c1-125
