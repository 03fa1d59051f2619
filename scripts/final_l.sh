#!/bin/bash
# The twenty-first session's GPU calls (2026-11-24).  Logs under $OUT.
#   STEP=a   wgwgrad's tune space on both wide bf16 presets (specgen tune --op wgrad
#            --strategy wgwgrad), verify --all-shapes --op all, the operator's tests,
#            GPU tier part 2 (the tensor-core strategies' drawn problems, wgwgrad's too)
#   STEP=b   the shipped winners benched (bench --best --op wgrad) on the wide bf16
#            presets, the autoencoder's step, GPU tier part 3
#   STEP=c   after the review mend (slice_sums): verify --all-shapes --op all, GPU tier part 2
#   STEP=d   after the second review mend: verify --all-shapes --op all, GPU tier parts 2
#            and 3 (part 1 with STEP=tier)
#   STEP=tier ae-dec1's bf16 wgrad (the planner's new wgwgrad beside tcwgrad and cuDNN),
#            then GPU tier part 1
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
case "${STEP:-a}" in
  a)
    for s in ae-enc2-bf16 ae-dec2-bf16; do
      timeout 150 python3 -m specgen tune --shape $s --op wgrad --strategy wgwgrad > $OUT/tune-wgwgrad-$s.log 2>&1
      echo "tune $s rc=$?"; tail -12 $OUT/tune-wgwgrad-$s.log | cut -c1-160
    done
    timeout 120 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -2 $OUT/verify-all.log; grep FAIL $OUT/verify-all.log | head
    timeout 150 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
    echo "torch rc=$?"; tail -3 $OUT/torch-tests.log | cut -c1-300
    LIMIT=200 PART=2 bash scripts/final_a.sh ;;
  b)
    for s in ae-enc2-bf16 ae-dec2-bf16; do
      timeout 150 python3 -m specgen bench --shape $s --op wgrad --best > $OUT/bench-best-wgrad-$s.log 2>&1
      echo "bench $s rc=$?"; grep -E "B=|^cudnn|^wgwgrad|^tcwgrad" $OUT/bench-best-wgrad-$s.log | cut -c1-160
    done
    timeout 200 python3 examples/autoencoder.py --channels-last --steps 10 --timed 50 > $OUT/autoencoder.log 2>&1
    echo "autoencoder rc=$?"; tail -25 $OUT/autoencoder.log | cut -c1-200
    LIMIT=300 PART=3 bash scripts/final_a.sh ;;
  c)
    timeout 120 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep FAIL $OUT/verify-all.log | head
    LIMIT=300 PART=2 bash scripts/final_a.sh ;;
  d)
    timeout 120 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep FAIL $OUT/verify-all.log | head
    LIMIT=150 PART=2 bash scripts/final_a.sh
    LIMIT=300 PART=3 bash scripts/final_a.sh ;;
  tier)
    timeout 60 python3 -m specgen bench --shape "C=128,M=128,H=8,W=8,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc" --batch 128 --op wgrad \
      --variant wgwgrad_b128x128_p6_s14_bf16 --variant tcwgrad_b128x128_w2x2_k32_p4_s29_bf16 > $OUT/bench-aedec1-bf16-wgrad.log 2>&1
    echo "bench ae-dec1 rc=$?"; grep -E "B=|^cudnn|^wgwgrad|^tcwgrad" $OUT/bench-aedec1-bf16-wgrad.log | cut -c1-160
    LIMIT=520 PART=1 bash scripts/final_a.sh ;;
esac
