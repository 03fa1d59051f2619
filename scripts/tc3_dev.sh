#!/bin/bash
# tc3wgrad (fp32 NCHW wgrad on tensor cores in 3xTF32) on the autoencoder's wide layers:
# its GPU tests (drawn problems, the preset batch), then each listed variant verified at
# B=128 and benched beside the shipped wtap winner and cuDNN in the same run.  V lists
# variants (names without the tc3wgrad_ prefix and the _fp32_wgrad suffix); NOTEST=1
# skips the tests; PROF="preset:name ..." profiles those with Nsight Compute.  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=$OUT/tc3-dev.log
if [ -z "$NOTEST" ]; then
  timeout 240 python3 -m pytest -q -m gpu tests/test_tc3wgrad.py -p no:cacheprovider > $OUT/tc3-tests.log 2>&1
  echo "tests rc=$?"; tail -1 $OUT/tc3-tests.log | cut -c1-300
fi
V=${V-b64x32_w2x4_r2_p4_s8}
for s in ${SHAPES-ae-enc2 ae-dec2}; do
  args=(--variant wtap_t8_m32_c16_p4_r4x3_w1_q3_s12_fp32_wgrad)
  for n in $V; do args+=(--variant tc3wgrad_${n}_fp32_wgrad); done
  for n in $V; do
    timeout 100 python3 -m specgen verify --shape $s --op wgrad --variant tc3wgrad_${n}_fp32_wgrad >> $LOG 2>&1; echo "verify $s $n rc=$?"
  done
  timeout 240 python3 -m specgen bench --shape $s --op wgrad "${args[@]}" >> $LOG 2>&1; echo "bench $s rc=$?"
done
grep -E "B=|^cudnn|^wtap|^tc3wgrad|not timed|rror|FAIL|PASS|passed|failed" $LOG | cut -c1-170
for pv in $PROF; do s=${pv%%:*}; n=${pv#*:}
  timeout 200 ncu --kernel-name regex:wgrad$ --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section SchedulerStats --section InstructionStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed_pipe_tensor.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" \
    python3 -m specgen bench --shape $s --op wgrad --variant tc3wgrad_${n}_fp32_wgrad > $OUT/tc3-prof-$s-$n.log 2>&1; echo "ncu $s $n rc=$?"
  grep -E "Duration|Issue Slots|Registers|Achieved Occ|Eligible|No Eligible|Block Limit (Sh|Reg)|pipe_tensor|Bank" $OUT/tc3-prof-$s-$n.log | head -16
  grep -E "issue_stalled" $OUT/tc3-prof-$s-$n.log | awk '$NF > 0.05' | head -20
done
