#!/usr/bin/env bash
# The eager step's host time, A/B: scripts/host_ablation.py run alternately on an older
# copy of the package (OLD, a folder holding specgen/ and templates/, e.g. made with
# `git archive REV specgen templates | tar -x -C ab/old`) and on this tree, ROUNDS times
# each, logs under $OUT.  Nothing is checked.
#   OLD=ab/old ROUNDS=2 MATH=bf16 bash scripts/host_ab.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
for i in $(seq 1 "${ROUNDS:-2}"); do
    for side in old new; do
        path=.
        [ "$side" = old ] && path=$OLD
        echo "== $side, round $i" | tee -a "$OUT/host-ab.log"
        PYTHONPATH=$path python3 scripts/host_ablation.py --math "${MATH:-bf16}" --rounds 3 2>&1 \
            | grep -v Warning | tee -a "$OUT/host-ab.log"
    done
done
