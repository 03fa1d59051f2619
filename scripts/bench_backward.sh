# Backward passes beside cuDNN on the GPU present: every preset's dgrad and wgrad
# default sets (and bgrad), logs and JSON under $OUT.
set -o pipefail
export PYTHONPATH=.
for op in ${OPS:-dgrad wgrad bgrad}; do
  python3 -m specgen bench --all-shapes --op $op --json $OUT/bench-$op.json 2>&1 | tee $OUT/bench-$op.log | grep -v "^  "
done
