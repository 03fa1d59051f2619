#!/bin/bash
# wgmma in tf32: its GPU tests (drawn problems in all three dtypes), the wide fp32
# channels-last layers' forward and dgrad beside tcgemm's tf32 and cuDNN, and the
# training step.  Logs under $OUT.
export PYTHONPATH=.
timeout ${TEST_LIMIT:-200} python3 -m pytest -q -m gpu tests/test_wgmma.py -p no:cacheprovider > $OUT/wgmma-tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/wgmma-tests.log | cut -c1-300
for spec in C=256,M=128 C=128,M=256; do
  for op in fprop dgrad; do
    timeout 90 python3 -m specgen bench --shape "$spec,H=16,W=16,K=3,pad=1,bias=1,layout=nhwc" --op $op \
      --batch 128 > $OUT/bench-$op-${spec//[=,]/}.log 2>&1
    echo "$spec $op"; grep -E "cudnn-(tf32|fp32)|wgmma|tcgemm" $OUT/bench-$op-${spec//[=,]/}.log | cut -c1-100
  done
done
if [ -z "$NO_AE" ]; then
  timeout 250 python3 examples/autoencoder.py --channels-last --steps 10 --timed 50 --json $OUT/autoencoder.json > $OUT/autoencoder.log 2>&1
  echo "autoencoder rc=$?"; grep largest $OUT/autoencoder.log; tail -5 $OUT/autoencoder.log
fi
