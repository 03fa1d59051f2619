#!/bin/bash
# tc3wgrad's GPU tests, the fp32 wgrad default sets of the autoencoder presets it serves
# beside cuDNN (SETS), and tune's search of its space on the wide layers (TUNE, BUDGET).
# Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ -z "$NOTEST" ]; then
  timeout 300 python3 -m pytest -q -m gpu tests/test_tc3wgrad.py -p no:cacheprovider > $OUT/tc3-tests.log 2>&1
  echo "tests rc=$?"; tail -1 $OUT/tc3-tests.log | cut -c1-300
fi
for s in ${SETS-ae-enc1 ae-dec1 ae-dec3}; do
  timeout 240 python3 -m specgen bench --shape $s --op wgrad > $OUT/tc3-set-$s.log 2>&1; echo "bench $s rc=$?"
  grep -E "B=|^cudnn-fp32|^cudnn-tf32|_fp32_wgrad" $OUT/tc3-set-$s.log | sort -k3 -n | head -8 | cut -c1-150
done
for s in ${TUNE-ae-enc2 ae-dec2}; do
  timeout 280 python3 -m specgen tune --shape $s --op wgrad --strategy tc3wgrad --budget ${BUDGET:-30} > $OUT/tc3-tune-$s.log 2>&1; echo "tune $s rc=$?"
  grep -v "verified/timed" $OUT/tc3-tune-$s.log | tail -12 | cut -c1-150
done
