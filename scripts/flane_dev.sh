#!/bin/bash
# flane (channels-last few-map forward) on the autoencoder's 256 -> 3 layer: verified
# at B=128 (fp32 with bias and relu, bf16) and on a strided, dilated drawn-like layer,
# benched beside the default set and cuDNN, tuned; then the GPU tier's default-set
# tests that draw problems (flane is in every default set it plans for).  Logs under $OUT.
export PYTHONPATH=.
for s in "ae-dec3-nhwc" "C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,act=relu,layout=nhwc" "C=256,M=3,H=32,W=32,K=3,pad=1,dtype=bf16,layout=nhwc" "C=20,M=4,H=9,W=11,K=3x2,stride=2,dil=2,pad=1,bias=1,layout=nhwc"; do
  timeout 60 python3 -m specgen verify --shape "$s" --strategy flane --batch 128 >> $OUT/flane-verify.log 2>&1
  echo "verify rc=$?"; tail -1 $OUT/flane-verify.log
done
timeout 100 python3 -m specgen bench --shape ae-dec3-nhwc > $OUT/flane-bench.log 2>&1
echo "bench rc=$?"; grep -E "cudnn-fp32|cudnn-tf32|flane|stream" $OUT/flane-bench.log | cut -c1-110
timeout 120 python3 -m specgen tune --shape ae-dec3-nhwc --strategy flane --budget 12 > $OUT/flane-tune.log 2>&1
echo "tune rc=$?"; tail -5 $OUT/flane-tune.log | cut -c1-120
timeout 330 python3 -m pytest -q -m gpu tests/test_gpu.py -k "random_problems or random_shapes or network_layers or ae-dec3" -p no:cacheprovider > $OUT/gpu-drawn.log 2>&1
echo "gpu drawn rc=$?"; tail -3 $OUT/gpu-drawn.log | cut -c1-300
