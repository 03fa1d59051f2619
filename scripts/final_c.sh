#!/bin/bash
# After a change to wlane or the operator: wlane verified on the autoencoder's layer
# at B=128 (fp32, bf16) and on drawn backward problems, the operator's tests, and the
# step.  Logs under $OUT.
export PYTHONPATH=.
NHWC="C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,layout=nhwc"
for s in "$NHWC" "$NHWC,dtype=bf16" "C=12,M=6,H=9,W=11,K=3x2,stride=2,dil=2,pad=1,groups=3,bias=1,layout=nhwc"; do
  timeout 60 python3 -m specgen verify --shape "$s,op=wgrad" --strategy wlane --batch 128 >> $OUT/wlane-verify.log 2>&1
  echo "verify rc=$?"; tail -1 $OUT/wlane-verify.log
done
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k "random_backward or batch_128" -p no:cacheprovider > $OUT/gpu-backward.log 2>&1
echo "gpu backward rc=$?"; tail -1 $OUT/gpu-backward.log
timeout 120 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch rc=$?"; tail -1 $OUT/torch-tests.log
timeout 200 python3 examples/autoencoder.py --channels-last --steps 10 --timed 50 --json $OUT/autoencoder.json > $OUT/autoencoder.log 2>&1
echo "ae rc=$?"; grep -E "largest" $OUT/autoencoder.log | cut -c1-160; tail -4 $OUT/autoencoder.log | cut -c1-140
