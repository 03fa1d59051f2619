#!/bin/bash
# tcgemm's tf32 path on the GPU: its drawn problems (test_tcgemm's GPU test), the
# autoencoder's wide fp32 layers in channels_last beside cuDNN and specgen's fp32
# stream, and the training step.  V names extra tcgemm variants (no dtype); logs under $OUT.
export PYTHONPATH=.
timeout ${TEST_LIMIT:-200} python3 -m pytest -q -m gpu tests/test_tcgemm.py -p no:cacheprovider > $OUT/pytest-tcgemm.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/pytest-tcgemm.log | cut -c1-300; grep -E "^E .*(assert|Error)" $OUT/pytest-tcgemm.log | head -5 | cut -c1-300
for spec in ${SPECS:-"C=256,M=128,H=16,W=16,K=3,pad=1" "C=128,M=256,H=16,W=16,K=3,pad=1" "C=128,M=256,H=16,W=16,K=3,pad=1,op=dgrad" "C=256,M=3,H=32,W=32,K=3,pad=1"}; do
  s="$spec,layout=nhwc"
  args="--variant stream_t8_m128_c8_r8x8_fp32"  # the planner's fp32 choice for these layers
  [[ $spec == *M=3,* ]] && args="--variant stream_t32_m3_c16_r3x8_fp32"
  [[ $spec == *wgrad* ]] && args=""  # fp32 NHWC wgrad has no fast fp32 strategy (the operator copies to NCHW)
  for v in ${V:-tcgemm_b128x128_w2x2_k16_p4 tcgemm_b128x128_w2x4_k16_p4 tcgemm_b128x128_w4x2_k16_p3 tcgemm_b64x128_w2x2_k16_p4}; do args="$args --variant ${v}_tf32"; done
  echo "== $s"
  timeout 90 python3 -m specgen bench --shape "$s" --batch 128 $args 2>&1 | grep -E "cudnn|tcgemm|tcwgrad|stream|floor|error" | cut -c1-120
done > $OUT/bench-tf32.log 2>&1
cat $OUT/bench-tf32.log
[ -n "${NO_AE:-}" ] && exit 0
timeout ${AE_LIMIT:-150} python3 examples/autoencoder.py --channels-last --steps 4 --timed 30 > $OUT/autoencoder.log 2>&1
echo "autoencoder rc=$?"; grep -E "math|fp32 |tf32 |bf16 |tcgemm" $OUT/autoencoder.log | cut -c1-160 | tail -12
