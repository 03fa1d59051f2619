# Backward passes beside cuDNN on the GPU present, logs and JSON under $OUT: each
# preset's shipped winners of the op (--best; its default set where none is shipped).
set -o pipefail
export PYTHONPATH=.
for op in ${OPS:-dgrad wgrad bgrad}; do
  ${PYTHON:-python3} -m specgen bench --all-shapes --op $op --best --json $OUT/bench-$op.json 2>&1 | tee $OUT/bench-$op.log | grep -v "^  "
done
