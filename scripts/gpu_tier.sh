#!/bin/bash
# The GPU tier on a GPU machine, from the source tree: every strategy's numbers against
# float64 on the presets and on drawn problems.  Log under $OUT (default out/).
#
#   PART=1  test_gpu.py: the presets' default sets (the short reductions)
#   PART=2  the tensor-core strategies' own GPU tests (tcgemm, wgmma, wgdsm, tcwhalo, wgwgrad,
#           kn2row, mmafew, tc3wgrad, mmarows, wgnchw, wgwino, wgplanar) and the depthwise ones (dwlane,
#           dwplane, wlane, wdw)
#   PART=3  test_gpu.py: drawn problems and the networks
#   PART=4  test_gpu.py: the long reductions and streamed batches
#   PART=op the PyTorch operator's tests (tests/test_torch.py, tests/test_batchnorm.py,
#           tests/test_convnorm.py, tests/test_replay.py, tests/test_pool.py,
#           tests/test_chain.py)
#   PART=verify  specgen verify --all-shapes --op all --all (every preset's default sets)
#   PART="1 2 3 4"  several parts at once on the one GPU, WORKERS (default 16) split among them
#   PART=two    the whole tier over two GPUs: parts 1 3 4 on the first, parts 2 and op then
#               verify on the second, WORKERS (default 16) on each
#   (none)  all of the above but verify in one run
#
# Each part fits one 10-minute device call; LIMIT (seconds, default 560) bounds it.
# Where pytest-xdist is installed the tests run in WORKERS processes (default 8) on the
# one GPU: the compiles and the float64 references, most of a test's time, overlap.
# Parts 1-4 at once took 510-530 s on an nvidia-h200 (16 cores, 5 workers each and 3
# for part 2, 2026-11-29); the operator's part and verify then need a call of their own.
# On an nvidia-h200-x2 (32 cores) PART=two fits one call: its two GPUs' halves took 340
# and 391-424 s from a cold cache (2026-11-29; part 1 184-188 s, 3 270 s, 4 332 s, 2
# 330-349 s, op 304-307 s, verify 54-67 s).
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}  # keep a caller's (carried wheels)
OUT=${OUT:-out}
mkdir -p "$OUT"
if [ "${PART:-}" = two ]; then  # a half of the tier on each of two GPUs, LIMIT each
    (CUDA_VISIBLE_DEVICES=0 PART="1 3 4" bash "$0" > "$OUT/gpu-tier-gpu0.txt" 2>&1) &
    start=$(date +%s)
    CUDA_VISIBLE_DEVICES=1 PART="2 op" bash "$0" > "$OUT/gpu-tier-gpu1.txt" 2>&1
    left=$(( ${LIMIT:-560} - ($(date +%s) - start) ))
    [ $left -gt 30 ] && CUDA_VISIBLE_DEVICES=1 PART=verify LIMIT=$left bash "$0" \
        >> "$OUT/gpu-tier-gpu1.txt" 2>&1
    wait
    cat "$OUT/gpu-tier-gpu0.txt" "$OUT/gpu-tier-gpu1.txt"
    exit 0
fi
PARTS=(${PART//,/ })
if [ ${#PARTS[@]} -gt 1 ]; then  # each part in a process of its own, side by side
    share=$(( (${WORKERS:-16} + ${#PARTS[@]} - 1) / ${#PARTS[@]} ))
    for part in "${PARTS[@]}"; do
        PART=$part WORKERS=$share bash "$0" > "$OUT/gpu-tier-$part.rc" 2>&1 &
    done
    wait
    for part in "${PARTS[@]}"; do
        echo "== part $part: $(head -1 "$OUT/gpu-tier-$part.rc")"
        grep -E "passed|failed|^verify:" "$OUT/gpu-tier-$part.log" | tail -3 | cut -c1-300
        rm -f "$OUT/gpu-tier-$part.rc"
    done
    exit 0
fi
if [ "${PART:-}" = verify ]; then
    LOG="$OUT/gpu-tier-verify.log"
    timeout "${LIMIT:-560}" python3 -m specgen verify --all-shapes --op all --all \
        --jobs "${WORKERS:-8}" > "$LOG" 2>&1
    echo "rc=$?"
    grep -E " FAIL|^verify:" "$LOG" | tail -20 | cut -c1-300
    exit 0
fi
TC="tests/test_tcgemm.py tests/test_wgmma.py tests/test_tcwhalo.py tests/test_wgwgrad.py
    tests/test_kn2row.py tests/test_tc3wgrad.py tests/test_mmarows.py tests/test_dwlane.py
    tests/test_wlane.py tests/test_wgdsm.py tests/test_mmafew.py tests/test_dwplane.py
    tests/test_wgnchw.py tests/test_wgwino.py tests/test_wgplanar.py tests/test_wdw.py"
K=""
case "${PART:-all}" in
  1) FILES="tests/test_gpu.py"; K="not random and not network and not default_batch and not batch_128 and not streamed" ;;
  2) FILES="$TC" ;;
  3) FILES="tests/test_gpu.py"; K="random or network" ;;
  4) FILES="tests/test_gpu.py"; K="default_batch or batch_128 or streamed" ;;
  op) FILES="tests/test_torch.py tests/test_batchnorm.py tests/test_convnorm.py tests/test_replay.py tests/test_pool.py tests/test_chain.py" ;;
  *) FILES="tests/test_gpu.py $TC tests/test_torch.py tests/test_batchnorm.py tests/test_convnorm.py tests/test_replay.py tests/test_pool.py tests/test_chain.py" ;;
esac
LOG="$OUT/gpu-tier${PART:+-$PART}.log"
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n ${WORKERS:-8}"
timeout "${LIMIT:-560}" python3 -m pytest -q -m gpu $FILES ${K:+-k "$K"} $XDIST \
    --durations=10 -p no:cacheprovider > "$LOG" 2>&1
echo "rc=$?"
tail -15 "$LOG" | cut -c1-400
