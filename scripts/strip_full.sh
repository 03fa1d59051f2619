#!/bin/bash
# Nsight Compute's full set on one launch of a 16-bit 7x7 kernel (mmastrip or
# mmapersist), printed as text: speed of light, memory, scheduler, warp states and the
# source counters' hottest SASS.  SHAPE, VARIANT; log under $OUT.
export PYTHONPATH=.
out=${OUT:-/tmp}
ncu --clock-control none -k "regex:${KERNEL:-mmastrip}" -s 3 -c 1 --set full --import-source no \
  --page details --print-details all \
  python3 -m specgen bench --shape "$SHAPE" --batch ${BATCH:-10000} --variant $VARIANT > $out/full-$VARIANT.log 2>&1
echo "rc=$?"; wc -l $out/full-$VARIANT.log
ncu --clock-control none -k "regex:${KERNEL:-mmastrip}" -s 3 -c 1 --section SourceCounters --section WarpStateStats \
  --page source --print-source sass \
  python3 -m specgen bench --shape "$SHAPE" --batch ${BATCH:-10000} --variant $VARIANT > $out/sass-$VARIANT.log 2>&1
echo "rc=$?"; wc -l $out/sass-$VARIANT.log
