#!/bin/bash
# The autoencoder's 3-channel layers in fp32 channels-last: every strategy's default
# beside cuDNN (enc1 forward, dec3 dgrad, dec3 forward), a stream tune of enc1, and
# Nsight Compute's memory view of stream's default there.  Logs under $OUT.
export PYTHONPATH=.
ENC1="C=3,M=256,H=32,W=32,K=3,pad=1,bias=1,layout=nhwc"
DEC3="C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,layout=nhwc"
for run in "enc1-fprop $ENC1 fprop" "dec3-dgrad $DEC3 dgrad" "dec3-fprop $DEC3 fprop"; do
  set -- $run
  timeout 100 python3 -m specgen bench --shape $2 --op $3 --batch 128 > $OUT/bench-$1.log 2>&1
  echo "== $1 rc=$?"; grep -vE "^ *$|verif|^#" $OUT/bench-$1.log | cut -c1-100 | head -30
done
timeout 200 python3 -m specgen tune --shape $ENC1 --strategy stream --budget ${BUDGET:-30} --batch 128 > $OUT/tune-enc1-stream.log 2>&1
echo "== tune rc=$?"; tail -6 $OUT/tune-enc1-stream.log | cut -c1-120
