#!/bin/bash
# Nsight Compute's per-instruction counts (SASS) of one wtap kernel: where the issue slots go.
export PYTHONPATH=.
s=${1:-layer1}; v=${2:-wtap_t16_m4_c1_p4_r1x1_w4_s1056_fp32_wgrad}
timeout 250 ncu --kernel-name regex:'wgrad$' --launch-skip 3 --launch-count 1 --section SourceCounters \
  --page source --print-source sass --csv \
  python3 -m specgen bench --shape $s --op wgrad --batch 1000 --variant $v > $OUT/wtap-sass-$s.csv 2>&1; echo "ncu rc=$?"
head -3 $OUT/wtap-sass-$s.csv | cut -c1-400
gzip -f $OUT/wtap-sass-$s.csv
