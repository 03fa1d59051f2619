#!/usr/bin/env bash
# The whole-model Dask tune on several GPU counts of one host, from one warm compile
# cache, each run with a database of its own; then a run whose GPU worker on card 1 is
# killed (kill -9) mid-run; then the wall times, the speedups over one GPU, how far
# each run's winners are from the one-GPU run's, and whether any item was recorded
# twice.  On a GPU host, from the source tree (KILL_GPUS: the kill run's GPUs, default 2):
#
#   MODEL=resnet50 BATCH=32 BUDGET=2 GPUS="4 2 1" OUT=out bash scripts/tune_scale.sh
#
# Logs: $OUT/tune-compile.log, $OUT/tune-gpusN.log, $OUT/tune-kill.log,
# $OUT/tune-scale.txt.  STEPS may end with "ship": the one-GPU run's winners go into
# specgen/layer_winners.json.  LIMIT caps each timed run (seconds, default 300); PRIME_BUDGET the
# priming run's budget (default BUDGET).  STEPS picks
# the steps (default "compile prime $GPUS kill"), so that a 10-minute device call can take
# some and the next call on the same warm machine the rest: the caches and databases
# stay under $CACHE, and the summary reads every run there.  The speedups are given on
# the tune's own wall (the cluster up and the items listed to the last winner) and on the
# whole command's (``time``'s real, with the model's trace and the cluster's start).
set -uo pipefail
MODEL=${MODEL:-resnet50}
BATCH=${BATCH:-32}
BUDGET=${BUDGET:-2}
GPUS=${GPUS:-"2 1"}
KILL_GPUS=${KILL_GPUS:-2}  # the GPUs of the kill run
OUT=${OUT:-out}
LIMIT=${LIMIT:-300}
PYTHON=${PYTHON:-python3}
CACHE=${CACHE:-$PWD/.cache/tune-scale}
export PYTHONPATH=${PYTHONPATH:-.}
LOGS=$CACHE/logs  # every step's log, kept for a later call's summary, copied to $OUT
mkdir -p "$OUT" "$LOGS"
# an array, not a function: timeout runs programs only
base=("$PYTHON" -m specgen tune --model "$MODEL" --batch "$BATCH")
tune=("${base[@]}" --budget "$BUDGET")

STEPS=${STEPS:-"compile prime $GPUS kill"}
fresh() {  # a run's own database and cache: a copy of the warm one
    rm -rf "$CACHE/g$1"
    cp -r "$CACHE/warm" "$CACHE/g$1"
}
for step in $STEPS; do
    case $step in
    compile)  # one compile phase for all runs: every run then finds its items compiled
        rm -rf "$CACHE/warm"
        { echo "# specgen tune --model $MODEL --batch $BATCH --budget $BUDGET --compile-only"
          date -u; time SPECGEN_CACHE_DIR=$CACHE/warm "${tune[@]}" --compile-only; } \
            > "$LOGS/tune-compile.log" 2>&1
        tail -3 "$LOGS/tune-compile.log" ;;
    prime)  # an untimed one-GPU run: on a fresh machine the first run also fills CuPy's
        # kernel cache and reads the libraries from disk, and its items took twice the
        # work (2 H200s, 2026-11-28); every timed run then starts from the same warm host.
        # PRIME_BUDGET (default BUDGET) makes it shorter: the warm-up is the host's, not
        # the items'
        fresh prime
        SPECGEN_CACHE_DIR=$CACHE/gprime timeout "$LIMIT" "${base[@]}" \
            --budget "${PRIME_BUDGET:-$BUDGET}" --gpus 1 --workers 8 > "$LOGS/tune-prime.log" 2>&1
        grep -E "^wall" "$LOGS/tune-prime.log" ;;
    kill)  # kill -9 of the process on GPU 1 once the run is under way (KILL_GPUS GPUs)
        fresh k
        { echo "# specgen tune --model $MODEL --batch $BATCH --budget $BUDGET --gpus $KILL_GPUS," \
               "GPU 1's worker killed"
          time SPECGEN_CACHE_DIR=$CACHE/gk timeout "$LIMIT" "${tune[@]}" --gpus "$KILL_GPUS" --workers 8; } \
            > "$LOGS/tune-kill.log" 2>&1 &
        run=$!
        # mid-run: once a quarter of the items are timed (the progress line, every 10 s);
        # the GPU worker holds a CUDA context from its start, so nvidia-smi alone would
        # find it before any task ran
        victim=""
        for _ in $(seq "$LIMIT"); do
            sleep 1
            kill -0 $run 2>/dev/null || break
            done_=$(grep -o "gpu [0-9]*/[0-9]*" "$LOGS/tune-kill.log" | tail -1 | tr -dc '0-9/ ')
            n=${done_%/*}; total=${done_#*/}
            if [ -n "$n" ] && [ -n "$total" ] && [ $((4 * ${n// /})) -ge "${total// /}" ]; then
                victim=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader -i 1 | head -1)
                break
            fi
        done
        [ -n "$victim" ] && kill -9 "$victim"
        note="kill -9 ${victim:-none} (GPU 1's worker) at $(grep -o "gpu [0-9]*/[0-9]*" "$LOGS/tune-kill.log" | tail -1) items"
        wait $run
        echo "$note" >> "$LOGS/tune-kill.log"  # after the run: its own writes would cover it
        tail -3 "$LOGS/tune-kill.log" ;;
    ship)  # the one-GPU run's winners shipped with specgen (specgen/layer_winners.json),
        # for the GPU that run measured on; the tree and this command go with them
        "$PYTHON" - "$CACHE/g1/tune.jsonl" "$MODEL" "$BATCH" "$BUDGET" <<'PY'
import subprocess, sys
from pathlib import Path
from specgen import tunedb
db, model, batch, budget = sys.argv[1:]
gpu = next(r["gpu"] for r in tunedb.records(Path(db)) if r["kind"] == "winner")
tree = subprocess.run(["git", "log", "-1", "--format=%h"], capture_output=True, text=True)
tune = dict(model=f"{model} at batch {batch}, --budget {budget}, one GPU",
            command=f"MODEL={model} BATCH={batch} BUDGET={budget} bash scripts/tune_scale.sh",
            tree=tree.stdout.strip())
print(tunedb.ship_layer_winners(Path(db), gpu, tune), "winners of", gpu, "shipped")
PY
        ;;
    *)  # a timed run on $step GPUs
        fresh "$step"
        { echo "# specgen tune --model $MODEL --batch $BATCH --budget $BUDGET --gpus $step --workers 8"
          date -u; nvidia-smi -L
          time SPECGEN_CACHE_DIR=$CACHE/g$step timeout "$LIMIT" "${tune[@]}" --gpus "$step" --workers 8; } \
            > "$LOGS/tune-gpus$step.log" 2>&1
        grep -E "^wall|^gpu:|^final:|^  of which" "$LOGS/tune-gpus$step.log" ;;
    esac
done

"$PYTHON" - "$CACHE" "$GPUS" > "$LOGS/tune-scale.txt" <<'PY'
import collections, json, re, sys
from pathlib import Path

cache, gpus = Path(sys.argv[1]), sys.argv[2].split()

def records(run):
    path = cache / run / "tune.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []

winners = {}
for n in gpus + ["k"]:
    rs = records(f"g{n}")
    keys = collections.Counter(
        (r["kind"], r["shape"], r["batch"], r["variant"], r["source"])
        for r in rs if r["kind"] in ("timing", "dropped"))
    twice = sum(1 for c in keys.values() if c > 1)
    won = {(r["shape"], r["batch"], r["precision"]): r for r in rs if r["kind"] == "winner"}
    winners[n] = won
    print(f"run {n}: {len(keys)} items timed or dropped, {twice} recorded twice, {len(won)} winners")
base = winners.get("1")
# the one-GPU run's own timings of each candidate: what another run's pick costs there
ones = {(r["shape"], r["batch"], r["precision"], r["variant"]): r["ms"]
        for r in records("g1") if r["kind"] == "timing"}

def cost(pick, b, g):
    """How much slower ``pick`` is than the one-GPU winner ``b``, measured in the one-GPU
    run: in its interleaved finals where the pick was a finalist, else its timings."""
    if pick == b["variant"]:
        return 0.0
    fin = b.get("finalists") or {}
    if pick in fin and b["variant"] in fin:
        return fin[pick] / fin[b["variant"]] - 1
    t, t0 = ones.get((*g, pick)), ones.get((*g, b["variant"]))
    return t / t0 - 1 if t and t0 else None

if base:
    for n in gpus:
        if n == "1":
            continue
        both = [g for g in winners[n] if g in base]
        same = sum(1 for g in both if winners[n][g]["variant"] == base[g]["variant"])
        costs = [cost(winners[n][g]["variant"], base[g], g) for g in both]
        known = [c for c in costs if c is not None]
        within = sum(1 for c in known if c <= 0.03)
        worst = max(known, default=0.0)
        print(f"--gpus {n} vs 1: {same}/{len(both)} the same kernel; {within}/{len(known)} picks "
              f"within 3% of the one-GPU winner on the one-GPU run's timings (worst {worst:+.1%})")
        off = [abs(winners[n][g]["ms"] / base[g]["ms"] - 1) for g in both]
        print(f"  winners' times, each on its own card: {sum(o <= 0.03 for o in off)}/{len(off)} "
              f"within 3% of the one-GPU run's")
PY
real() {  # the whole command's seconds, from time's "real 1m6.737s"
    grep -m1 "^real" "$1" 2>/dev/null | awk '{split($2, t, /[ms]/); print t[1] * 60 + t[2]}'
}
one=$(grep -m1 "^wall" "$LOGS/tune-gpus1.log" 2>/dev/null | awk '{print $2}')
one_real=$(real "$LOGS/tune-gpus1.log")
for n in $GPUS; do
    w=$(grep -m1 "^wall" "$LOGS/tune-gpus$n.log" 2>/dev/null | awk '{print $2}')
    r=$(real "$LOGS/tune-gpus$n.log")
    if [ -n "$w" ] && [ -n "$one" ]; then
        echo "--gpus $n: wall $w s, $(awk -v a="$one" -v b="$w" 'BEGIN{printf "%.2f", a/b}')x one GPU's;" \
             "the whole command $r s, $(awk -v a="$one_real" -v b="$r" 'BEGIN{printf "%.2f", a/b}')x"
    else
        echo "--gpus $n: ${w:+wall $w s}${w:-not run, or cut off}"
    fi >> "$LOGS/tune-scale.txt"
done
grep -h "^kill -9" "$LOGS/tune-kill.log" >> "$LOGS/tune-scale.txt" 2>/dev/null
for n in $GPUS; do  # where each timed run's seconds before its first item went
    grep -m1 "^setup" "$LOGS/tune-gpus$n.log" 2>/dev/null | sed "s/^/--gpus $n: /"
done >> "$LOGS/tune-scale.txt"
cat "$LOGS/tune-scale.txt"
cp "$LOGS"/tune-*.log "$LOGS"/tune-scale.txt "$OUT"/ 2>/dev/null || true
# every run's database, one file (a device call returns at most eight)
out=$(cd "$OUT" && pwd)
(cd "$CACHE" && tar czf "$out/tune-dbs.tgz" g*/tune.jsonl 2>/dev/null) || true
