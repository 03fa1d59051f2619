#!/bin/bash
# The twentieth session's GPU calls (2026-11-24).  Logs under $OUT.
#   STEP=a      the operator's tests and the GPU tier's drawn problems at the state the
#               last session left (7d52865 and after: never run there), and where the
#               bf16 autocast step's host time goes (step_host, host_breakdown,
#               step_host_parts)
#   STEP=b      the operator's host path before and after this session's change (the
#               committed package unpacked to old/ beside the working tree:
#               scripts/host_cmp.sh), its tests, and the autoencoder's step
#   STEP=c      wgmma's whole space tuned for ae-dec2-bf16's forward (its shipped winner
#               is ae-enc2's), then the shipped winners of both benched three times
#   STEP=d      where ae-enc2's fp32 wgrad winner stalls, by SASS line (Nsight Compute's
#               source counters), and what an output allocation costs the host
#   STEP=e      verify --all-shapes --op all, the operator's tests, the wide layers' fp32
#               wgrad winners benched (bench --best)
#   STEP=tier   GPU tier part 1 (every preset's default sets and winners)
#   STEP=f      after the review mends: verify --all-shapes --op all, the operator's
#               tests, the wide layers' fp32 wgrad winners (bench --best), tier part 3
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
case "${STEP:-a}" in
  a)
    timeout 150 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
    echo "torch rc=$?"; tail -3 $OUT/torch-tests.log | cut -c1-300
    timeout 60 python3 scripts/step_host.py --math bf16 > $OUT/step-host-bf16.log 2>&1
    echo "step_host rc=$?"; head -40 $OUT/step-host-bf16.log | cut -c1-160
    timeout 60 python3 scripts/host_breakdown.py --math bf16 > $OUT/host-breakdown-bf16.log 2>&1
    echo "host_breakdown rc=$?"; cat $OUT/host-breakdown-bf16.log | cut -c1-160
    timeout 60 python3 scripts/step_host_parts.py --math bf16 > $OUT/step-host-parts-bf16.log 2>&1
    echo "parts rc=$?"; cat $OUT/step-host-parts-bf16.log | cut -c1-160
    LIMIT=300 PART=3 bash scripts/final_a.sh ;;
  b)
    timeout 150 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
    echo "torch rc=$?"; tail -3 $OUT/torch-tests.log | cut -c1-300
    bash scripts/host_cmp.sh
    for tree in old .; do
      PYTHONPATH=$tree:. timeout 60 python3 scripts/step_host_parts.py --math bf16 > $OUT/parts-$tree.log 2>&1
      echo "parts $tree rc=$?"; tail -2 $OUT/parts-$tree.log
    done
    timeout 200 python3 examples/autoencoder.py --channels-last --steps 10 --timed 50 > $OUT/autoencoder.log 2>&1
    echo "autoencoder rc=$?"; tail -8 $OUT/autoencoder.log ;;
  c)
    export SPECGEN_CACHE_DIR=$OUT/cache  # the tune database (tune.jsonl) comes back
    timeout 400 python3 -m specgen tune --shape ae-dec2-bf16 --op fprop --strategy wgmma --budget 60 > $OUT/tune-ae-dec2-bf16.log 2>&1
    echo "tune rc=$?"; grep -vE "^\s*$" $OUT/tune-ae-dec2-bf16.log | tail -25 | cut -c1-150
    for i in 1 2 3; do
      for s in ae-enc2-bf16 ae-dec2-bf16; do
        timeout 60 python3 -m specgen bench --shape $s --op fprop --best >> $OUT/bench-fprop-best.log 2>&1
      done
    done
    grep -E "^cudnn|^wgmma|B=" $OUT/bench-fprop-best.log | cut -c1-130 ;;
  d)
    timeout 60 python3 scripts/alloc_micro.py > $OUT/alloc-micro.log 2>&1; echo "alloc rc=$?"; cat $OUT/alloc-micro.log
    v=wtap_t8_m32_c16_p4_r4x3_w1_q3_s12_fp32_wgrad
    timeout 300 ncu --kernel-name regex:wgrad$ --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats \
      --metrics smsp__pcsamp_warps_issue_stalled_dispatch_stall,smsp__pcsamp_warps_issue_stalled_not_selected,smsp__pcsamp_sample_count \
      --print-details all python3 -m specgen bench --shape ae-enc2 --op wgrad --variant $v > $OUT/wtap-source-ae-enc2.log 2>&1
    echo "ncu rc=$?"; grep -iE "dispatch|stall|Warp Cycles" $OUT/wtap-source-ae-enc2.log | head -30 | cut -c1-200
    timeout 200 ncu --kernel-name regex:wgrad$ --launch-skip 3 --launch-count 1 --set full --import-source no -o $OUT/wtap-ae-enc2 \
      python3 -m specgen bench --shape ae-enc2 --op wgrad --variant $v > $OUT/wtap-full-ae-enc2.log 2>&1
    echo "ncu full rc=$?"
    timeout 100 ncu -i $OUT/wtap-ae-enc2.ncu-rep --page source --csv --print-source sass > $OUT/wtap-sass-ae-enc2.csv 2>&1
    echo "sass rc=$?"; head -3 $OUT/wtap-sass-ae-enc2.csv | cut -c1-400; gzip -f $OUT/wtap-sass-ae-enc2.csv ;;
  e)
    timeout 200 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | head -5 | cut -c1-200
    timeout 150 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
    echo "torch rc=$?"; tail -1 $OUT/torch-tests.log
    for s in ae-enc2 ae-dec2; do
      timeout 60 python3 -m specgen bench --shape $s --op wgrad --best >> $OUT/bench-wgrad-best.log 2>&1; echo "bench $s rc=$?"
    done
    grep -hE "B=|^cudnn-fp32|^wtap" $OUT/bench-wgrad-best.log | cut -c1-118 ;;
  tier)
    LIMIT=570 PART=1 bash scripts/final_a.sh ;;
  f)
    timeout 100 python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1
    echo "verify rc=$?"; tail -1 $OUT/verify-all.log; grep -E "FAIL" $OUT/verify-all.log | head -5 | cut -c1-200
    timeout 120 python3 -m pytest -q tests/test_torch.py -p no:cacheprovider > $OUT/torch-tests.log 2>&1
    echo "torch rc=$?"; tail -1 $OUT/torch-tests.log
    for s in ae-enc2 ae-dec2; do
      timeout 40 python3 -m specgen bench --shape $s --op wgrad --best >> $OUT/bench-wgrad-best.log 2>&1; echo "bench $s rc=$?"
    done
    grep -hE "B=|^cudnn-fp32|^wtap" $OUT/bench-wgrad-best.log | cut -c1-118
    LIMIT=300 PART=3 bash scripts/final_a.sh ;;
esac
