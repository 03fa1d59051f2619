#!/bin/bash
# The twenty-seventh session's closing GPU calls (2026-11-25), after kn2row and the
# ae-dec3-bf16 preset.  STEP=a: verify every preset's default sets (all ops), the
# tensor-core tier (PART=2, kn2row's drawn problems among them) and the operator's GPU
# tests.  STEP=b: the presets' tier (PART=1) and its drawn problems (PART=3).  STEP=c:
# its long reductions and streamed batches (PART=4).  STEP=d: `make bench`'s forward
# table (bench --all-shapes --best) and seed 003's step.  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${STEP:-a}" in
a)
timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head
LIMIT=${L2:-300} PART=2 bash scripts/final_a.sh
timeout ${LT:-150} python3 -m pytest -q -m gpu tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch tests rc=$?"; tail -3 $OUT/torch-tests.log | cut -c1-300 ;;
b)
timeout 120 python3 -m pytest -q -m gpu tests/test_kn2row.py -p no:cacheprovider > $OUT/kn2row-tests.log 2>&1
echo "kn2row tests rc=$?"; tail -2 $OUT/kn2row-tests.log | cut -c1-300
timeout 60 python3 -m specgen verify --shape ae-dec3-bf16 --op all > $OUT/verify-ae-dec3-bf16.log 2>&1; echo "verify rc=$?"; tail -1 $OUT/verify-ae-dec3-bf16.log
for op in fprop dgrad wgrad; do timeout 60 python3 -m specgen bench --shape ae-dec3-bf16 --op $op --best > $OUT/best-ae-dec3-bf16-$op.log 2>&1
echo "bench --best $op rc=$?"; grep -E "^cudnn-bf16|verified|not timed" $OUT/best-ae-dec3-bf16-$op.log | cut -c1-130; done
LIMIT=${L1:-150} PART=1 bash scripts/final_a.sh
LIMIT=${L3:-400} PART=3 bash scripts/final_a.sh ;;
c)
LIMIT=${L4:-560} PART=4 bash scripts/final_a.sh ;;
d)
timeout ${LB:-400} python3 -m specgen bench --all-shapes --best --json $OUT/bench.json --plot $OUT/bench.png > $OUT/bench.log 2>&1
echo "bench rc=$?"; grep -E "B=|^cudnn|verified|not timed" $OUT/bench.log | grep -E "ae-dec3|B=" | cut -c1-150 | tail -30
timeout ${LA:-180} python3 examples/autoencoder.py --channels-last --steps 10 --timed 50 > $OUT/autoencoder.log 2>&1
echo "autoencoder rc=$?"; tail -6 $OUT/autoencoder.log ;;
esac
