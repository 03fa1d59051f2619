#!/bin/bash
# The twenty-fourth session's development runs (2026-11-24): mmahwc with stacked output rows
# (`v<R>`: each input row's ldmatrix feeds R output rows, each B fragment R of them),
# verified on drawn-like problems with stacks, guarded bands, shifts, swizzled bands, bias
# and activation, then benched beside each preset's shipped winner and cuDNN.  NOVERIFY=1
# or NOBENCH=1 skip a part; L2D/M2B/... replace a list; PROF="preset:op:variant ..."
# profiles kernels.  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/stack-dev.log
[ -n "$NOVERIFY" ] || for sv in \
  "C=16,M=4,H=20,W=21,K=7,pad=6,dtype=bf16:fprop:mmahwc_t6_r16x32_s4_v2_bf16" \
  "C=16,M=4,H=20,W=21,K=7,pad=6:fprop:mmahwc_t6_r16x16_s4_v2_tf32" \
  "C=12,M=24,H=17,W=17,K=7,bias=1,act=relu,dtype=fp16:fprop:mmahwc_t8_r24x16_s1_v4_fp16" \
  "C=5,M=9,H=13,W=14,K=5,pad=2,bias=1:fprop:mmahwc_t6_r16x16_s1_v3_tf32" \
  "C=4,M=16,H=20,W=20,K=7,dtype=bf16:fprop:mmahwc_t14_r16x32_s2_v2_bf16" \
  "C=12,M=6,H=10,W=13,K=5,pad=2,dtype=bf16:fprop:mmahwc_t4_r24x16_s4_v2_bf16" ; do
  s=${sv%%:*}; rest=${sv#*:}; op=${rest%%:*}; n=${rest#*:}
  timeout 120 python3 -m specgen verify --shape "$s" --op $op --variant $n >> $LOG 2>&1; echo "verify $s $op $n rc=$?"
done
grep -E "FAIL|rror" $LOG | cut -c1-200 | head -20
bench() {  # preset op variants...
  local s=$1 op=$2; shift 2; local args=()
  for n in "$@"; do args+=(--variant $n); done
  timeout ${BT:-200} python3 -m specgen bench --shape $s --op $op "${args[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"
}
if [ -z "$NOBENCH" ]; then
  [ -n "$NOL2D" ] || bench layer2-bf16 dgrad ${L2D-mmahwc_t20_r16x48_s4_v1_bf16 mmahwc_t20_r16x32_s4_v2_bf16 mmahwc_t20_r16x16_s4_v2_bf16 mmahwc_t20_r16x48_s4_v2_bf16 mmahwc_t20_r16x16_s4_v4_bf16 mmahwc_t20_r16x32_s4_v4_bf16 mmahwc_t40_r16x32_s4_v2_bf16 mmahwc_t14_r16x16_s4_v2_bf16 mmahwc_t20_r8x64_s2_v2_bf16 mmahwc_t20_r8x32_s2_v4_bf16 mmahwc_t20_r32x16_s8_v2_bf16}
  [ -n "$NOM2B" ] || bench mx-layer2-bf16 fprop ${M2B-mmahwc_t14_r24x80_s1_v1_bf16 mmahwc_t14_r24x32_s1_v2_bf16 mmahwc_t14_r24x16_s1_v2_bf16 mmahwc_t12_r24x16_s1_v4_bf16 mmahwc_t16_r24x16_s1_v4_bf16 mmahwc_t12_r24x16_s1_v3_bf16 mmahwc_t14_r8x64_s1_v2_bf16 mmahwc_t12_r8x32_s1_v4_bf16 mmahwc_t14_r16x32_s1_v2_bf16}
  [ -n "$X" ] && for xv in $X; do s=${xv%%:*}; rest=${xv#*:}; op=${rest%%:*}; bench $s $op $(echo ${rest#*:} | tr , " "); done
  grep -E "B=|^cudnn|^mma|not timed|FAIL" $LOG | cut -c1-170
fi
for pov in $PROF; do s=${pov%%:*}; rest=${pov#*:}; op=${rest%%:*}; v=${rest#*:}
  timeout 200 ncu --kernel-name regex:^mmahwc --launch-skip 2 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats \
    python3 -m specgen bench --shape $s --op $op --batch 2000 --variant $v > $OUT/stack-prof-$s-$op.log 2>&1; echo "ncu $s $op rc=$?"
  grep -E "Duration|Throughput|Registers|Achieved Occ|Eligible|Pipe|Stall|Issued|Bank" $OUT/stack-prof-$s-$op.log | head -30
done
