#!/bin/bash
# The 7x7 presets' backward passes as they stand: the 16-bit presets' dgrad and wgrad
# default sets, and the fp32 presets' shipped winners, each beside cuDNN in the same run
# (issue 12's targets).  Logs under $OUT.
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/gpu.txt
for s in layer1-bf16 layer2-bf16 mx-layer1-bf16 mx-layer2-bf16; do
  for op in dgrad wgrad; do
    timeout 150 python3 -m specgen bench --shape $s --op $op --json $OUT/base-$s-$op.json >> $OUT/bwd7-base.log 2>&1
    echo "bench $s $op rc=$?"
  done
done
for s in layer1 layer2 mx-layer1 mx-layer2; do
  timeout 60 python3 -m specgen bench --shape $s --op dgrad --best >> $OUT/bwd7-base.log 2>&1
  timeout 60 python3 -m specgen bench --shape $s --op wgrad --best >> $OUT/bwd7-base.log 2>&1
done
grep -E "B=|^cudnn|_dgrad|_wgrad|not timed" $OUT/bwd7-base.log | cut -c1-118
