#!/bin/bash
# The GPU checks after wstrip and mmafold (2026-11-24), in calls that fit a device call:
#   STEP=new    their GPU tests, the 16-bit 7x7 presets' shipped winners of each op
#               benched beside cuDNN bf16 (specgen bench --best), the operator's tests
#   STEP=tier1  the GPU tier's presets and long reductions (final_a.sh PART=1)
#   STEP=tier3  the GPU tier's drawn problems (PART=3), then verify --all-shapes --op all
# Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
case "${STEP:-new}" in
  new)
    timeout 230 python3 -m pytest -q -m gpu tests/test_wstrip.py tests/test_gpu.py \
      -k "wstrip or random_16bit or seven_by_seven_layers_at_batch" -p no:cacheprovider > $OUT/new-gpu-tests.log 2>&1
    echo "new gpu tests rc=$?"; tail -2 $OUT/new-gpu-tests.log | cut -c1-300
    mkdir -p $OUT/json
    for s in layer1-bf16 layer2-bf16 mx-layer1-bf16 mx-layer2-bf16; do
      for op in fprop dgrad wgrad; do
        timeout 60 python3 -m specgen bench --shape $s --op $op --best --json $OUT/json/bench-$s-$op.json >> $OUT/bench-7x7-bf16-best.log 2>&1
        echo "bench $s $op rc=$?"
      done
    done
    (cd $OUT && tar czf bench-7x7-bf16-best-json.tgz json && rm -rf json)
    grep -E "B=|^cudnn|^mma|^wstrip|not timed" $OUT/bench-7x7-bf16-best.log | cut -c1-118
    timeout 150 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
    echo "torch rc=$?"; tail -1 $OUT/torch-tests.log ;;
  tier1)
    LIMIT=575 PART=1 bash scripts/final_a.sh ;;
  tier3)
    LIMIT=250 PART=3 bash scripts/final_a.sh
    timeout 320 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | head -5 | cut -c1-200 ;;
esac
