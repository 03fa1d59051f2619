#!/bin/bash
# The tensor-core pass on the GPU: the drawn-problem tests, verify of the 16-bit
# presets, their bench beside cuDNN (every op), then the whole GPU tier.  Logs in $OUT.
set -u
export PYTHONPATH=.
out=${OUT:-/tmp}
sg="python3 -m specgen"
python3 -m pytest -q -p no:cacheprovider tests/test_tcgemm.py -m gpu 2>&1 | tail -5 | tee $out/tc-tests.log
for s in ae-enc2-bf16 ae-dec2-bf16; do
  $sg verify --shape $s --op all 2>&1 | tail -3
done | tee $out/verify-bf16.log
for s in ae-enc2-bf16 ae-dec2-bf16; do
  $sg bench --shape $s --op all 2>&1
done > $out/bench-bf16.log
grep -E "cudnn|tcgemm|tcwgrad|B=" $out/bench-bf16.log | cut -c1-120
if [ -n "${PROFILE:-}" ]; then
  ncu --clock-control none -k "regex:tcgemm" -s 10 -c 1 --section SpeedOfLight --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
    python3 -m specgen bench --shape ae-enc2-bf16 --variant tcgemm_b128x128_w2x2_k32_p4_bf16 > $out/ncu.log 2>&1
  grep -E "Duration|Throughput|Pipe|Warp Cycles|Registers|Achieved Occupancy|Bank|Issued|Eligible" $out/ncu.log | head -40
fi
