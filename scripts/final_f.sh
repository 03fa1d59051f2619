#!/bin/bash
# The GPU checks after mmatoep (2026-11-24), in calls that fit a device call:
#   STEP=new    the 16-bit dgrad views drawn and the 7x7 layers at B=1000 on the
#               planner's kernels (mmatoep's among them), the 16-bit 7x7 presets' shipped
#               dgrad winners benched beside cuDNN bf16 (specgen bench --best)
#   STEP=tier   the GPU tier's drawn problems (final_a.sh PART=3), the operator's tests
#   STEP=verify specgen verify --all-shapes --op all
#   STEP=tests  the first step's tests, then verify --all (after a fix)
# Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
case "${STEP:-new}" in
  tests)
    timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py \
      -k "random_16bit or seven_by_seven_layers_at_batch" -p no:cacheprovider > $OUT/new-gpu-tests.log 2>&1
    echo "new gpu tests rc=$?"; tail -2 $OUT/new-gpu-tests.log | cut -c1-300
    timeout 380 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | head -5 | cut -c1-200 ;;
  new)
    timeout 170 python3 -m pytest -q -m gpu tests/test_gpu.py \
      -k "random_16bit or seven_by_seven_layers_at_batch" -p no:cacheprovider > $OUT/new-gpu-tests.log 2>&1
    echo "new gpu tests rc=$?"; tail -2 $OUT/new-gpu-tests.log | cut -c1-300
    mkdir -p $OUT/json
    for s in layer1-bf16 layer2-bf16 mx-layer1-bf16 mx-layer2-bf16; do
      timeout 45 python3 -m specgen bench --shape $s --op dgrad --best --json $OUT/json/bench-$s-dgrad.json >> $OUT/bench-dgrad-bf16-best.log 2>&1
      echo "bench $s dgrad rc=$?"
    done
    (cd $OUT && tar czf bench-dgrad-bf16-best-json.tgz json && rm -rf json)
    grep -E "B=|^cudnn|^mma|not timed" $OUT/bench-dgrad-bf16-best.log | cut -c1-118 ;;
  verify)
    timeout 560 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | head -5 | cut -c1-200 ;;
  tier)
    LIMIT=330 PART=3 bash scripts/final_a.sh
    timeout 150 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
    echo "torch rc=$?"; tail -1 $OUT/torch-tests.log ;;
esac
