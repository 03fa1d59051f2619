#!/bin/bash
# wstrip on the H200: its GPU tests (drawn problems, the 7x7 layers at B=1000), then the
# 16-bit 7x7 layers' wgrad, the default and variants around it, beside cuDNN bf16 at
# B=10000.  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/wstrip-dev.log
timeout 200 python3 -m pytest -q -m gpu tests/test_wstrip.py -p no:cacheprovider > $OUT/wstrip-gpu-tests.log 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/wstrip-gpu-tests.log | cut -c1-300
b() { s=$1; shift; args=(); for v in "$@"; do args+=(--variant ${v}_wgrad_iobf16); done
  timeout 120 python3 -m specgen bench --shape $s --op wgrad "${args[@]}" >> $LOG 2>&1; echo "bench $s rc=$?"; }
b layer1-bf16 wstrip_t40_r8x8_s264_bf16 wstrip_t40_r8x5_s264_bf16 wstrip_t20_r8x5_s264_bf16 wstrip_t80_r8x10_s132_bf16 wstrip_t27_r8x9_s264_bf16 wstrip_t16_r8x8_s396_bf16
b layer2-bf16 wstrip_t17_r16x6_s264_bf16 wstrip_t34_r16x6_s132_bf16 wstrip_t17_r8x6_s264_bf16 wstrip_t12_r16x6_s264_bf16 wstrip_t9_r16x9_s264_bf16 wstrip_t12_r16x4_s264_bf16
b mx-layer1-bf16 wstrip_t22_r16x8_s264_bf16 wstrip_t33_r16x6_s132_bf16 wstrip_t22_r8x8_s264_bf16 wstrip_t11_r16x6_s264_bf16 wstrip_t17_r16x6_s264_bf16
b mx-layer2-bf16 wstrip_t27_r24x7_s132_bf16 wstrip_t14_r24x7_s132_bf16 wstrip_t9_r24x5_s132_bf16 wstrip_t27_r24x4_s132_bf16 wstrip_t27_r24x9_s132_bf16
grep -E "B=|^cudnn|^wstrip|not timed" $LOG | cut -c1-125
