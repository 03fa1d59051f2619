#!/bin/bash
# Nsight Compute on wtap's main kernel (not its reduce) at B=2000: PROF lists preset:variant
# pairs (by default layer1's and mx-layer1's).
export PYTHONPATH=.
p() { s=$1; v=$2
  timeout 250 ncu --kernel-name regex:'wgrad$' --launch-skip 3 --launch-count 1 --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
    --section InstructionStats --section Occupancy --section SchedulerStats --section LaunchStats --section SourceCounters \
    --metrics smsp__inst_executed_op_shared_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,smsp__sass_thread_inst_executed_op_ffma_pred_on.sum,smsp__inst_executed.sum,smsp__inst_executed_op_ldgsts.sum,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_mio_throttle,smsp__pcsamp_warps_issue_stalled_short_scoreboard,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_math_pipe_throttle,smsp__pcsamp_warps_issue_stalled_wait,smsp__pcsamp_warps_issue_stalled_not_selected,smsp__pcsamp_warps_issue_stalled_selected \
    python3 -m specgen bench --shape $s --op wgrad --batch 2000 --variant $v > $OUT/wtap-prof-$s.log 2>&1; echo "ncu $s rc=$?"
  grep -E "Duration|Throughput|Pipe|Issue|avefront|Bank|Registers|Achieved Occ|Eligible|inst_executed|ffma|ldgsts|stalled|Block Limit" $OUT/wtap-prof-$s.log | head -70; grep -A25 "Warp Stall Sampling" $OUT/wtap-prof-$s.log | head -40; }
for sv in ${PROF-layer1:wtap_t16_m4_c1_p4_r1x1_w4_s1056_fp32_wgrad mx-layer1:wtap_t12_m12_c1_p4_r1x1_w4_s1056_fp32_wgrad}; do
  p ${sv%%:*} ${sv#*:}
done
