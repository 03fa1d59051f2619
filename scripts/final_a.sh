#!/bin/bash
# The GPU tier: every strategy on the presets and on drawn problems (tcgemm, tcwgrad, tcwhalo, tc3wgrad, mmarows,
# wgmma and wgwgrad included).  Log under $OUT.  The whole tier takes longer than a device call:
# PART=1, 2 and 3 split it, each in a call of its own.
export PYTHONPATH=.
# With the 16-bit 7x7 presets (2026-11-23) test_gpu.py alone outgrew a call: PART=1
# runs its presets' default sets and long reductions, PART=3 its drawn problems.
K=""
case "${PART:-all}" in
  1) FILES="tests/test_gpu.py"; K="not random and not network and not default_batch and not batch_128 and not streamed" ;;
  # With mmahwc's tf32 kernels in the fp32 presets' default sets (2026-11-24) PART=1 outgrew
  # a call again: PART=4 runs its long reductions and streamed batches.
  4) FILES="tests/test_gpu.py"; K="default_batch or batch_128 or streamed" ;;
  2) FILES="tests/test_tcgemm.py tests/test_wgmma.py tests/test_tcwhalo.py tests/test_wgwgrad.py tests/test_kn2row.py tests/test_tc3wgrad.py tests/test_mmarows.py" ;;
  3) FILES="tests/test_gpu.py"; K="random or network" ;;
  *) FILES="tests/test_gpu.py tests/test_tcgemm.py tests/test_wgmma.py tests/test_tcwhalo.py tests/test_wgwgrad.py tests/test_kn2row.py tests/test_tc3wgrad.py tests/test_mmarows.py" ;;
esac
timeout ${LIMIT:-560} python3 -m pytest -q -m gpu $FILES ${K:+-k "$K"} -p no:cacheprovider > $OUT/gpu-tier${PART:+-$PART}.log 2>&1
echo "rc=$?"; tail -15 $OUT/gpu-tier${PART:+-$PART}.log | cut -c1-400
