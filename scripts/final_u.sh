#!/bin/bash
# The twenty-eighth session's checks after its review mend (the operator's direct launch;
# the runtime's launcher).  STEP=a: the operator's GPU tests, verify over every preset
# (all ops) and the tensor-core tier (PART=2).  STEP=b: the drawn problems (PART=3).
# STEP=c: the long reductions and streamed batches (PART=4).  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
case "${STEP:-a}" in
a)
timeout 200 python3 -m pytest -q -m gpu tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
echo "torch tests rc=$?"; tail -1 $OUT/torch-tests.log | cut -c1-300
timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; echo "verify rc=$?"
tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | cut -c1-200 | head
LIMIT=${L2:-300} PART=2 bash scripts/final_a.sh ;;
b)
LIMIT=${L3:-560} PART=3 bash scripts/final_a.sh ;;
c)
LIMIT=${L4:-580} PART=4 bash scripts/final_a.sh ;;
esac
