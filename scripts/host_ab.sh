#!/usr/bin/env bash
# The eager step's host time against cuDNN's, A/B across versions of the package:
# scripts/host_ablation.py (each step alternated with cuDNN's) run in turn on older
# copies of the package (folders holding specgen/ and templates/, made with
# `git archive REV specgen templates | tar -x -C ab/NAME`) and on this tree, ROUNDS
# times over, logs under $OUT.  Nothing is checked.
#   VERSIONS="ab/old ab/mid ." ROUNDS=2 MATH=bf16 bash scripts/host_ab.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
for i in $(seq 1 "${ROUNDS:-2}"); do
    for path in ${VERSIONS:-.}; do
        echo "== $path, round $i" | tee -a "$OUT/host-ab.log"
        PYTHONPATH=$path python3 scripts/host_ablation.py --math "${MATH:-bf16}" --rounds 3 \
            --only specgen 2>&1 | grep -v Warning | tee -a "$OUT/host-ab.log"
    done
done
