#!/bin/bash
# Stall reasons and pipe use of wgmma variants on ae-enc2-bf16 (Nsight Compute), one
# kernel launch each after warm-up.  VARIANTS names them (without the dtype); logs under $OUT.
set -u
export PYTHONPATH=.
out=${OUT:-/tmp}
for v in ${VARIANTS:-wgmma_b256x128_p4_q2}; do
  ncu --clock-control none -k "regex:$v" -s 5 -c 1 \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum" \
    python3 -m specgen bench --shape ${SHAPE:-ae-enc2-bf16} --variant ${v}_bf16 > $out/prof-$v.log 2>&1
  echo "== $v"; grep -E "stalled|gmma|issue_active|duration|wavefronts" $out/prof-$v.log | awk '$NF+0 > 0.05 || /gmma|duration|issue_active|wavefronts/' | sed 's/  */ /g'
done
