#!/bin/bash
# verify over every preset and op, the 16-bit wide layers' bench beside cuDNN, the
# operator's tests and the autoencoder in channels_last.  Logs under $OUT.
export PYTHONPATH=.
timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL|ERROR" $OUT/verify-all.log | head -5
for s in ae-enc2-bf16 ae-dec2-bf16; do
  for op in fprop dgrad; do
    timeout 80 python3 -m specgen bench --shape $s --op $op > $OUT/bench-$s-$op.log 2>&1
    grep -E "cudnn|wgmma|tcgemm|tcwgrad" $OUT/bench-$s-$op.log | cut -c1-110
  done
done
timeout 100 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch rc=$?"; tail -1 $OUT/torch-tests.log
timeout ${AE_LIMIT:-150} python3 examples/autoencoder.py --channels-last --steps 10 --timed 50 \
  --json $OUT/autoencoder.json > $OUT/autoencoder.log 2>&1
echo "autoencoder rc=$?"; grep -E "largest|math|fp32 |tf32 |bf16 " $OUT/autoencoder.log | tail -6
