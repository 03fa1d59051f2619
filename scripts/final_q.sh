#!/bin/bash
# The twenty-sixth session's GPU calls (2026-11-25), after wgmma's TMA feed became the
# default where its boxes apply.  STEP=a: the second dev round (dgrad, tf32 defaults),
# verify every preset's default sets (all ops), the tensor-core tier (PART=2, the TMA
# feed's drawn problems among them).  STEP=b: the operator's GPU tests, the presets' tier
# (PART=1) and seed 003's training step.  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ "${STEP:-a}" = a ]; then
STEP=2 bash scripts/tma_dev.sh
timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head
LIMIT=${L2:-300} PART=2 bash scripts/final_a.sh
else
timeout ${LT:-200} python3 -m pytest -q -m gpu tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch tests rc=$?"; tail -3 $OUT/torch-tests.log | cut -c1-300
LIMIT=${L1:-120} PART=1 bash scripts/final_a.sh
timeout ${LA:-250} python3 examples/autoencoder.py --channels-last --steps 10 --timed 50 > $OUT/autoencoder.log 2>&1
echo "autoencoder rc=$?"; tail -14 $OUT/autoencoder.log
fi
