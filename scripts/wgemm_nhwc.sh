#!/bin/bash
# wgemm on channels-last fp32 tensors: its GPU tests, each autoencoder layer's fp32
# wgrad in NHWC beside NCHW and cuDNN, and the training step.  Logs under $OUT.
export PYTHONPATH=.
timeout ${TEST_LIMIT:-200} python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider \
  -k "channels_last_fp32_wgrad or random_backward" > $OUT/wgemm-nhwc-tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/wgemm-nhwc-tests.log | cut -c1-300
for spec in C=3,M=256,H=32,W=32 C=256,M=128,H=16,W=16 C=128,M=128,H=8,W=8 C=128,M=256,H=16,W=16; do
  for layout in nhwc nchw; do
    timeout 90 python3 -m specgen bench --shape "$spec,K=3,pad=1,bias=1,layout=$layout,op=wgrad" \
      --batch 128 > $OUT/bench-$layout-${spec//[=,]/}.log 2>&1
    echo "$spec $layout"; grep -E "cudnn|wgemm|wband|wsplit" $OUT/bench-$layout-${spec//[=,]/}.log | cut -c1-110
  done
done
if [ -z "$NO_AE" ]; then
  timeout 300 python3 examples/autoencoder.py --channels-last --steps 2 --timed 30 > $OUT/autoencoder.log 2>&1
  echo "autoencoder rc=$?"; tail -5 $OUT/autoencoder.log
fi
