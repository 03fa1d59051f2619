#!/bin/bash
# The operator's host time before and after a change, in one device run: the committed
# package unpacked beside the working tree first
#     mkdir old && git archive HEAD specgen templates | tar -x -C old
# then this (on the device), and `rm -rf old` after.  Logs under $OUT.
for tree in old .; do
  tag=$([ $tree = old ] && echo old || echo new)
  PYTHONPATH=$tree:. timeout 120 python3 scripts/dispatch_overhead.py > $OUT/dispatch-$tag.log 2>&1
  echo "dispatch $tag rc=$?"; head -13 $OUT/dispatch-$tag.log
  PYTHONPATH=$tree:. timeout 100 python3 scripts/step_host.py --math bf16 --math fp32 > $OUT/step-host-$tag.log 2>&1
  echo "step $tag rc=$?"; head -5 $OUT/step-host-$tag.log
done
