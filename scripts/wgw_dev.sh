#!/bin/bash
# The twenty-first session's development runs (2026-11-24): wgwgrad (wgrad on wgmma
# with MN-major operands) verified on the wide bf16 layers and drawn problems, then
# benched beside tcwgrad and cuDNN; wtap's aligned x rows verified and benched on the
# wide fp32 layers.  V="spec:variant ..." adds verifies; NOBENCH=1 skips the benches;
# PROF=1 profiles wgwgrad on ae-enc2-bf16.  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/wgw-dev.log
for s in ae-enc2-bf16 ae-dec2-bf16 \
  "C=128,M=256,H=16,W=16,K=3,pad=1,bias=1,dtype=fp16,layout=nhwc" \
  "C=128,M=128,H=9,W=11,K=3,pad=1,stride=2,groups=2,bias=1,dtype=bf16,layout=nhwc" \
  "C=64,M=64,H=7,W=5,K=3,pad=0,dil=2,bias=1,dtype=bf16,layout=nhwc"; do
  timeout 120 python3 -m specgen verify --shape "$s" --op wgrad --strategy wgwgrad >> $LOG 2>&1; echo "verify wgwgrad $s rc=$?"
done
for sv in $V; do s=${sv%%:*}; n=${sv#*:}
  timeout 120 python3 -m specgen verify --shape "$s" --op wgrad --variant $n >> $LOG 2>&1; echo "verify $s $n rc=$?"
done
for s in ae-enc2 ae-dec2 ae-enc1 ae-dec1 ae-dec3; do
  timeout 120 python3 -m specgen verify --shape $s --op wgrad --strategy wtap >> $LOG 2>&1; echo "verify wtap $s rc=$?"
done
grep -E "FAIL|rror" $LOG | cut -c1-200 | head -20
if [ -z "$NOBENCH" ]; then
  E=${E-b128x256_p4_s14 b128x256_p3_s14 b128x128_p6_s7 b128x128_p4_s14 b64x256_p4_s14}
  D=${D-b128x128_p6_s7 b128x128_p4_s14 b128x128_p6_s14 b64x128_p6_s7}
  args=(--variant tcwgrad_b128x128_w2x2_k32_p4_s14_bf16); for n in $E; do args+=(--variant wgwgrad_${n}_bf16); done
  timeout 200 python3 -m specgen bench --shape ae-enc2-bf16 --op wgrad "${args[@]}" >> $LOG 2>&1; echo "bench ae-enc2-bf16 rc=$?"
  args=(--variant tcwgrad_b128x128_w2x2_k32_p4_s14_bf16); for n in $D; do args+=(--variant wgwgrad_${n}_bf16); done
  timeout 200 python3 -m specgen bench --shape ae-dec2-bf16 --op wgrad "${args[@]}" >> $LOG 2>&1; echo "bench ae-dec2-bf16 rc=$?"
  for s in ae-enc2 ae-dec2; do
    timeout 200 python3 -m specgen bench --shape $s --op wgrad --best >> $LOG 2>&1; echo "bench $s rc=$?"
  done
  grep -E "B=|^cudnn|^wgwgrad|^tcwgrad|^wtap|^wgemm|not timed" $LOG | cut -c1-160
fi
if [ -n "$PROF" ]; then
  timeout 200 ncu --kernel-name regex:wgrad_iobf16_nhwc$ --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section LaunchStats \
    python3 -m specgen bench --shape ae-enc2-bf16 --op wgrad --strategy wgwgrad > $OUT/wgw-prof.log 2>&1; echo "ncu rc=$?"
  grep -E "Duration|Throughput|Registers|Achieved Occ|Eligible|Pipe" $OUT/wgw-prof.log | head -30
fi
