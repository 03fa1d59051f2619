#!/bin/bash
# mmastrip, mmafold and mmapersist's 16-bit kernel on band16's 16-byte fetch and
# word-wise spread: their GPU tests, then the 16-bit 7x7 presets' shipped winners of the
# forward pass and dgrad beside cuDNN bf16 (specgen bench --best).  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
timeout 260 python3 -m pytest -q -m gpu tests/test_gpu.py -k "random_16bit or seven_by_seven_layers_at_batch" -p no:cacheprovider > $OUT/fetch16-gpu-tests.log 2>&1
echo "gpu tests rc=$?"; tail -2 $OUT/fetch16-gpu-tests.log | cut -c1-300
for s in layer1-bf16 layer2-bf16 mx-layer1-bf16 mx-layer2-bf16; do
  for op in fprop dgrad; do
    timeout 60 python3 -m specgen bench --shape $s --op $op --best >> $OUT/fetch16-bench.log 2>&1
    echo "bench $s $op rc=$?"
  done
done
grep -E "B=|^cudnn|^mma|not timed" $OUT/fetch16-bench.log | cut -c1-118
