#!/bin/bash
# verify over every preset and op, the 16-bit wide layers' bench beside cuDNN, the
# 3-channel layers' wgrad, the operator's tests and the autoencoder in channels_last.
# Logs under $OUT.
export PYTHONPATH=.
timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL|ERROR" $OUT/verify-all.log | head -5
for s in ae-enc2-bf16 ae-dec2-bf16; do
  for op in fprop dgrad; do
    timeout 80 python3 -m specgen bench --shape $s --op $op > $OUT/bench-$s-$op.log 2>&1
    grep -E "cudnn|wgmma|tcgemm|tcwgrad" $OUT/bench-$s-$op.log | cut -c1-110
  done
done
# the 3-channel layers' wgrad with db (tcwhalo) beside cuDNN and the rest of the default set
for spec in "C=3,M=256" "C=256,M=3"; do
  timeout 90 python3 -m specgen bench --shape "$spec,H=32,W=32,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad" \
    --batch 128 > $OUT/bench-wgrad-${spec//[=,]/}.log 2>&1
  grep -E "cudnn|tcwhalo|wband" $OUT/bench-wgrad-${spec//[=,]/}.log | cut -c1-110
done
timeout 100 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch rc=$?"; tail -1 $OUT/torch-tests.log
timeout ${AE_LIMIT:-200} python3 examples/autoencoder.py --channels-last --steps 10 --timed 50 \
  --json $OUT/autoencoder.json > $OUT/autoencoder.log 2>&1
echo "autoencoder rc=$?"; grep -E "largest|math|fp32 |tf32 |bf16 " $OUT/autoencoder.log | tail -6 | cut -c1-120
