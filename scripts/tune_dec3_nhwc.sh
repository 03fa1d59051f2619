#!/bin/bash
# The channels-last 256 -> 3 layer's forward and dgrad (preset ae-dec3-nhwc), tuned in
# fp32 and tf32 math beside the default set's bench: the candidates for its shipped
# winners.  Logs under $OUT.
export PYTHONPATH=.
timeout 100 python3 -m specgen bench --shape ae-dec3-nhwc > $OUT/dec3-nhwc-bench-fprop.log 2>&1
echo "bench rc=$?"; grep -E "cudnn" $OUT/dec3-nhwc-bench-fprop.log | cut -c1-100; sort -k3 -n $OUT/dec3-nhwc-bench-fprop.log | grep -E "^[a-z]+_" | grep -v cudnn | head -5 | cut -c1-100
timeout 100 python3 -m specgen bench --shape ae-dec3-nhwc --op dgrad > $OUT/dec3-nhwc-bench-dgrad.log 2>&1
echo "bench dgrad rc=$?"; grep -E "cudnn" $OUT/dec3-nhwc-bench-dgrad.log | cut -c1-100; sort -k3 -n $OUT/dec3-nhwc-bench-dgrad.log | grep -E "^[a-z]+_" | grep -v cudnn | head -5 | cut -c1-100
timeout 130 python3 -m specgen tune --shape ae-dec3-nhwc --strategy stream --budget 24 > $OUT/dec3-nhwc-tune-stream.log 2>&1
echo "tune stream rc=$?"; tail -5 $OUT/dec3-nhwc-tune-stream.log | cut -c1-120
timeout 100 python3 -m specgen tune --shape ae-dec3-nhwc --strategy mma --precision tf32 --budget 12 > $OUT/dec3-nhwc-tune-mma.log 2>&1
echo "tune mma rc=$?"; tail -4 $OUT/dec3-nhwc-tune-mma.log | cut -c1-120
