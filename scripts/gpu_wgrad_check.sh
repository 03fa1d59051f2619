set -o pipefail
export PYTHONPATH=.
python3 -m specgen verify --all-shapes --op wgrad > $OUT/verify-wgrad.log 2>&1; tail -1 $OUT/verify-wgrad.log
for s in layer1 layer2 mx-layer1 mx-layer2; do python3 -m specgen verify --shape $s --op wgrad --strategy wband --batch 10000 2>&1 | tail -2 | head -1; done
python3 -m pytest -q -m gpu tests -k "backward or wgrad_at" -x 2>&1 | tail -3
OPS=wgrad bash scripts/bench_backward.sh > $OUT/bench.log 2>&1
grep -E "B=|cudnn-fp32|cudnn-bf16|wband|wsplit" $OUT/bench-wgrad.log | cut -c1-120
