#!/bin/bash
# The twentieth session's GPU calls (2026-11-24).  Logs under $OUT.
#   STEP=a      the operator's tests and the GPU tier's drawn problems at the state the
#               last session left (7d52865 and after: never run there), and where the
#               bf16 autocast step's host time goes (step_host, host_breakdown,
#               step_host_parts)
#   STEP=b      the operator's host path before and after this session's change (the
#               committed package unpacked to old/ beside the working tree:
#               scripts/host_cmp.sh), its tests, and the autoencoder's step
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
esac
