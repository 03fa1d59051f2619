#!/bin/bash
# The GPU tier: every strategy on the presets and on drawn problems (tcgemm, tcwgrad, tcwhalo,
# wgmma included).  Log under $OUT.  The whole tier takes about 520 s on the H200, near a
# device call's limit: PART=1 runs tests/test_gpu.py alone, PART=2 the tensor-core files,
# each in a call of its own.
export PYTHONPATH=.
case "${PART:-all}" in
  1) FILES="tests/test_gpu.py" ;;
  2) FILES="tests/test_tcgemm.py tests/test_wgmma.py tests/test_tcwhalo.py" ;;
  *) FILES="tests/test_gpu.py tests/test_tcgemm.py tests/test_wgmma.py tests/test_tcwhalo.py" ;;
esac
timeout ${LIMIT:-560} python3 -m pytest -q -m gpu $FILES -p no:cacheprovider > $OUT/gpu-tier${PART:+-$PART}.log 2>&1
echo "rc=$?"; tail -15 $OUT/gpu-tier${PART:+-$PART}.log | cut -c1-400
