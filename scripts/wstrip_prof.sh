#!/bin/bash
# Nsight Compute on wstrip (layer1's and mx-layer2's bf16 wgrad at B=10000, one launch
# after warm-up): the full set as text, and the source counters' SASS with stall reasons.
# Logs under $OUT.
export PYTHONPATH=.
for pair in "layer1-bf16 wstrip_t80_r8x10_s132_bf16_wgrad_iobf16" "mx-layer2-bf16 wstrip_t27_r24x4_s132_bf16_wgrad_iobf16"; do
  set -- $pair
  ncu --clock-control none -k "regex:wstrip.*[0-9]_wgrad_iobf16$" -s 3 -c 1 --set full --import-source no \
    --page details --print-details all \
    python3 -m specgen bench --shape $1 --op wgrad --variant $2 > $OUT/wprof-full-$1.log 2>&1
  echo "full $1 rc=$?"
  ncu --clock-control none -k "regex:wstrip.*[0-9]_wgrad_iobf16$" -s 3 -c 1 --section SourceCounters --section WarpStateStats \
    --page source --print-source sass \
    python3 -m specgen bench --shape $1 --op wgrad --variant $2 > $OUT/wprof-sass-$1.log 2>&1
  echo "sass $1 rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|Tensor|No Eligible|Eligible Warps" $OUT/wprof-full-$1.log | head -40 | sed 's/  */ /g'
done
