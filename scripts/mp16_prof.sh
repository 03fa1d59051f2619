#!/bin/bash
# Nsight Compute on mmapersist's or mmastrip's (KERNEL=mmastrip) 16-bit kernel: stall reasons, pipe use, occupancy.
# SHAPE is an inline 16-bit spec, VARIANT its variant name; one launch after warm-up.
set -u
export PYTHONPATH=.
out=${OUT:-/tmp}
ncu --clock-control none -k "regex:${KERNEL:-mmapersist}" -s 3 -c 1 \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_red.sum,smsp__inst_executed_op_global_st.sum,sm__cycles_active.avg,gpu__time_duration.sum" \
  python3 -m specgen bench --shape "$SHAPE" --batch ${BATCH:-10000} --variant $VARIANT > $out/prof-$VARIANT.log 2>&1
grep -E "stalled|hmma|issue_active|duration|wavefronts|conflicts|warps_active|dram__|inst_executed|lts__|cycles_active" $out/prof-$VARIANT.log | awk '$NF+0 > 0.05 || /hmma|duration|issue_active|wavefronts|dram|warps_active|lts|inst_exec|cycles/' | sed 's/  */ /g'
