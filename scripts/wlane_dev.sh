#!/bin/bash
# wlane (channels-last few-map wgrad) on the autoencoder's 256 -> 3 layer: verified at
# B=128 and on drawn backward problems, benched beside the rest of the default set and
# cuDNN (NHWC), beside the NCHW set, and tuned.  Logs under $OUT.
export PYTHONPATH=.
NHWC="C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,layout=nhwc"
timeout 120 python3 -m specgen verify --shape "$NHWC,op=wgrad" --strategy wlane --batch 128 > $OUT/wlane-verify.log 2>&1
echo "verify rc=$?"; tail -3 $OUT/wlane-verify.log | cut -c1-200
timeout 120 python3 -m specgen verify --shape "$NHWC,dtype=bf16,op=wgrad" --strategy wlane --batch 128 >> $OUT/wlane-verify.log 2>&1
echo "verify bf16 rc=$?"; tail -1 $OUT/wlane-verify.log | cut -c1-200
timeout 100 python3 -m specgen bench --shape "$NHWC,op=wgrad" --batch 128 > $OUT/wlane-bench-nhwc.log 2>&1
echo "bench rc=$?"; grep -E "cudnn|wlane|wband|wgemm|wsplit|tcw" $OUT/wlane-bench-nhwc.log | cut -c1-120
timeout 100 python3 -m specgen bench --shape "C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,op=wgrad" --batch 128 > $OUT/wlane-bench-nchw.log 2>&1
echo "bench nchw rc=$?"; grep -E "cudnn|wband" $OUT/wlane-bench-nchw.log | cut -c1-120
timeout 150 python3 -m specgen tune --shape "$NHWC" --op wgrad --strategy wlane --budget 12 --batch 128 > $OUT/wlane-tune.log 2>&1
echo "tune rc=$?"; tail -8 $OUT/wlane-tune.log | cut -c1-140
