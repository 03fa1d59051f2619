#!/bin/bash
# The twenty-eighth session's closing GPU calls (2026-11-25), after the operator's own
# autocast cast.  STEP=a: verify every preset's default sets (all ops: the launcher
# changed), the operator's GPU tests, and where the eager bf16 step's host time goes
# (scripts/host_ablation.py).  STEP=b: the presets' tier (PART=1) and seed 003's step
# with the loss curves.  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${STEP:-a}" in
a)
timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head
timeout ${LT:-200} python3 -m pytest -q -m gpu tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch tests rc=$?"; tail -2 $OUT/torch-tests.log | cut -c1-300
timeout ${LH:-200} python3 scripts/host_ablation.py --math bf16 --math tf32 --rounds 2 2>&1 | grep -v Warn > $OUT/host-ablation.log
echo "ablation rc=$?"; cat $OUT/host-ablation.log ;;
b)
LIMIT=${L1:-200} PART=1 bash scripts/final_a.sh
timeout ${LA:-240} python3 examples/autoencoder.py --channels-last --steps 20 --timed 50 --json $OUT/autoencoder.json --plot $OUT/autoencoder.png > $OUT/autoencoder.log 2>&1
echo "autoencoder rc=$?"; tail -6 $OUT/autoencoder.log ;;
esac
