#!/bin/bash
# The thirty-first session's GPU calls (2026-11-27), after the operator's leaner autocast
# path (wgrad's fp32 grads, the one-allocation cast, the eager apply) and the cached
# aligned address of each tensor map's encoding.
# STEP=a: the operator's GPU tests, and verify over every preset (all ops: every launch,
# the TMA kernels' included).  STEP=b: the GPU tests of wgmma, wgwgrad and tcwhalo (the
# TMA launches, the wgrads whose second pass the operator widens), seed 003's step, and
# the eager step's host time A/B against 9ae5ab4's package (ab/old).  STEP=c: the
# operator's GPU tests and seed 003's step again, after kernel_for's widened wgrads
# stopped compiling the plain kernel first.  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "${STEP:-a}" in
a)
timeout 200 python3 -m pytest -q -m gpu tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch tests rc=$?"; tail -1 $OUT/torch-tests.log | cut -c1-300
timeout 300 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head ;;
b)
timeout ${LT:-240} python3 -m pytest -q -m gpu tests/test_wgmma.py tests/test_wgwgrad.py tests/test_tcwhalo.py \
  -p no:cacheprovider > $OUT/tma-wgrad-tests.log 2>&1
echo "tests rc=$?"; tail -1 $OUT/tma-wgrad-tests.log | cut -c1-300
python3 examples/autoencoder.py --channels-last --steps 20 --timed 50 --json $OUT/autoencoder.json \
  --plot $OUT/losses.png > $OUT/autoencoder.log 2>&1; echo "autoencoder rc=$?"
grep -v "^specgen:" $OUT/autoencoder.log | tail -8
VERSIONS="ab/old ." ROUNDS=1 bash scripts/host_ab.sh > /dev/null 2>&1; grep -A3 "==" $OUT/host-ab.log | grep -v "^$\|each:" ;;
c)
timeout 200 python3 -m pytest -q -m gpu tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch tests rc=$?"; tail -1 $OUT/torch-tests.log | cut -c1-300; grep -E "^FAILED" $OUT/torch-tests.log | head
python3 examples/autoencoder.py --channels-last --steps 20 --timed 50 --json $OUT/autoencoder.json \
  --plot $OUT/losses.png > $OUT/autoencoder.log 2>&1; echo "autoencoder rc=$?"
grep -v "^specgen:" $OUT/autoencoder.log | tail -6 ;;
esac
