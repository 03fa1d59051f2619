#!/bin/bash
# After the 16-bit 7x7 kernels: verify --all over every preset and op, the operator's
# tests, and the 16-bit 7x7 presets benched with their shipped winners beside cuDNN.
# Logs under $OUT.
export PYTHONPATH=.
timeout 240 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
echo "verify rc=$?"; tail -1 $OUT/verify-all.log
timeout 120 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch rc=$?"; tail -1 $OUT/torch-tests.log
for s in layer1-bf16 layer2-bf16 mx-layer1-bf16 mx-layer2-bf16; do
  timeout 100 python3 -m specgen bench --shape $s --best --json $OUT/bench-$s.json >> $OUT/bench-7x7-bf16.log 2>&1
  echo "bench $s rc=$?"
done
grep -E "^cudnn|^mma|B=10000" $OUT/bench-7x7-bf16.log | cut -c1-125
