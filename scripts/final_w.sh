#!/bin/bash
# The thirtieth session's GPU calls (2026-11-27), after mmarows (one map's window rows on
# the tensor cores' n side) for the one-channel layers' 16-bit dgrad.
# STEP=a: the two presets' bf16 dgrad, mmarows beside the shipped winners and cuDNN
# (`specgen bench --variant ...`, B=10000), mmarows' GPU tests, and verify over every
# preset (all ops).  STEP=b: the operator's GPU tests.  STEP=c: the GPU tier's tests
# that the new winners and planner choice reach (the two presets' default sets and
# winners, the 16-bit 7x7 layers at B=1000 on the planner's kernels, and the drawn narrow
# 16-bit forward passes and dgrad views).  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "${STEP:-a}" in
a)
b() { s=$1; shift; a=(); for n in "$@"; do a+=(--variant $n); done
  timeout 100 python3 -m specgen bench --shape $s --op dgrad "${a[@]}" > $OUT/bench-dgrad-$s.log 2>&1; echo "bench $s rc=$?"
  grep -E "B=|^cudnn|^mm" $OUT/bench-dgrad-$s.log | cut -c1-150; }
b mx-layer1-bf16 mmahwc_t18_r8x16_s8_v6_k3_bf16 mmarows_i1_r4_bf16 mmarows_i2_r2_bf16
b layer1-bf16 mmatoep_t43_r1x6_m1_bf16 mmarows_i1_r8_bf16 mmarows_i2_r8_bf16
timeout 120 python3 -m pytest -q -m gpu tests/test_mmarows.py -p no:cacheprovider > $OUT/rows-tests.log 2>&1
echo "mmarows tests rc=$?"; tail -1 $OUT/rows-tests.log | cut -c1-300
timeout 240 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head ;;
b)
timeout ${LT:-300} python3 -m pytest -q -m gpu tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch tests rc=$?"; tail -2 $OUT/torch-tests.log | cut -c1-300 ;;
c)
timeout ${LC:-420} python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider \
  -k "seven_by_seven or random_16bit or (preset_variant and layer1-bf16)" > $OUT/gpu-tier-16bit.log 2>&1
echo "tier rc=$?"; tail -3 $OUT/gpu-tier-16bit.log | cut -c1-300 ;;
esac
