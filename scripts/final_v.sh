#!/bin/bash
# The twenty-ninth session's GPU calls (2026-11-25), after tc3wgrad (fp32 wgrad in
# 3xTF32 on the tensor cores) and the operator's route of fp32 channels_last wgrad to it.
# STEP=a: its tests, the autoencoder presets' fp32 wgrad (--best beside cuDNN), verify
# over every preset (all ops), the operator's GPU tests and seed 003's step.
# STEP=b: the presets' tier (PART=1) and the tensor-core strategies' (PART=2).
# STEP=c: the drawn problems (PART=3).  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${STEP:-a}" in
a)
timeout 300 python3 -m pytest -q -m gpu tests/test_tc3wgrad.py -p no:cacheprovider > $OUT/tc3-tests.log 2>&1
echo "tc3 tests rc=$?"; tail -1 $OUT/tc3-tests.log | cut -c1-300
for s in ae-enc1 ae-enc2 ae-dec1 ae-dec2; do
  timeout 120 python3 -m specgen bench --shape $s --op wgrad --best > $OUT/bench-wgrad-$s.log 2>&1; echo "bench $s rc=$?"
  grep -E "B=|^cudnn-fp32|^cudnn-tf32|_fp32_wgrad" $OUT/bench-wgrad-$s.log | cut -c1-150
done
timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head
timeout ${LT:-200} python3 -m pytest -q -m gpu tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch tests rc=$?"; tail -2 $OUT/torch-tests.log | cut -c1-300
timeout ${LA:-240} python3 examples/autoencoder.py --channels-last --steps 20 --timed 50 --json $OUT/autoencoder.json --plot $OUT/autoencoder.png > $OUT/autoencoder.log 2>&1
echo "autoencoder rc=$?"; tail -8 $OUT/autoencoder.log ;;
b)
LIMIT=${L1:-200} PART=1 bash scripts/final_a.sh
LIMIT=${L2:-330} PART=2 bash scripts/final_a.sh ;;
c)
LIMIT=${L3:-560} PART=3 bash scripts/final_a.sh ;;
esac
