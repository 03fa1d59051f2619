#!/bin/bash
# The GPU tier: every strategy on the presets and on drawn problems (tcgemm, tcwgrad, tcwhalo,
# wgmma included).  Log under $OUT.
export PYTHONPATH=.
timeout ${LIMIT:-560} python3 -m pytest -q -m gpu tests/test_gpu.py tests/test_tcgemm.py tests/test_wgmma.py tests/test_tcwhalo.py \
  -p no:cacheprovider > $OUT/gpu-tier.log 2>&1
echo "rc=$?"; tail -15 $OUT/gpu-tier.log | cut -c1-400
