#!/usr/bin/env bash
# Dev runs (2026-11-27, thirty-first session): STEP=a the operator's tests, the eager step's host
# time A/B against the previous package (ab/old), the pieces of a forward call; STEP=b
# seed 003's step; STEP=c the step's host profile and ablation.  Logs under $OUT.
set -u
export PYTHONPATH=.
OUT=${OUT:-out}
case "${STEP:-a}" in
a)
    python3 -m pytest -q -x tests/test_torch.py 2>&1 | tail -15 | tee "$OUT/torch-tests.log"
    VERSIONS="ab/old ." ROUNDS=2 bash scripts/host_ab.sh > /dev/null 2>&1
    cat "$OUT/host-ab.log"
    python3 scripts/host_pieces.py 2>&1 | grep -v Warn | tee "$OUT/host-pieces.log"
    ;;
b)
    python3 examples/autoencoder.py --channels-last --steps 20 --timed 50 \
        --json "$OUT/autoencoder.json" --plot "$OUT/losses.png" 2>&1 \
        | grep -v "Warn\|^specgen:" | tail -12 | tee "$OUT/autoencoder.log"
    ;;
esac
case "${STEP:-a}" in
c)
    python3 scripts/step_host.py --math bf16 2>&1 | grep -v "Warn\|^specgen:" | head -60 | tee "$OUT/step-host.log"
    python3 scripts/host_ablation.py --math bf16 --rounds 2 2>&1 | grep -v "Warn\|^specgen:" | tee "$OUT/host-ablation.log"
    ;;
esac
