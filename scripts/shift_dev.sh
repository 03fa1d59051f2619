#!/bin/bash
# The twenty-third session's development runs (2026-11-24): mmahwc with a map's
# neighbouring output columns on the n side (shifts) and in tf32 for fp32 tensors,
# verified on problems with shifts, swizzled bands, guarded maps and columns, bias and
# activation, then benched beside each preset's shipped winner and cuDNN.  NOVERIFY=1 or
# NOBENCH=1 skip a part; PROF="preset:op:variant ..." profiles kernels.  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/shift-dev.log
[ -n "$NOVERIFY" ] || for sv in \
  "C=16,M=4,H=20,W=21,K=7,pad=6,dtype=bf16:fprop:mmahwc_t5_r16x32_s4_v1_bf16" \
  "C=16,M=4,H=20,W=21,K=7,pad=6:fprop:mmahwc_t5_r16x32_s4_v1_tf32" \
  "C=12,M=6,H=10,W=13,K=5,pad=2,bias=1,act=relu,dtype=fp16:fprop:mmahwc_t3_r24x16_s4_v1_fp16" \
  "C=12,M=6,H=10,W=13,K=5,pad=2,bias=1,act=relu:fprop:mmahwc_t3_r24x16_s4_v1_tf32" \
  "C=5,M=9,H=13,W=14,K=5,pad=2,bias=1:fprop:mmahwc_t4_r16x32_s1_v1_tf32" \
  "C=20,M=16,H=9,W=15,K=3,pad=1:fprop:mmahwc_t9_r32x64_s2_v1_tf32" \
  "C=13,M=12,H=11,W=9,K=3,pad=1,dtype=bf16:fprop:mmahwc_t4_r16x16_s1_v1_bf16" ; do
  s=${sv%%:*}; rest=${sv#*:}; op=${rest%%:*}; n=${rest#*:}
  timeout 120 python3 -m specgen verify --shape "$s" --op $op --variant $n >> $LOG 2>&1; echo "verify $s $op $n rc=$?"
done
grep -E "FAIL|rror" $LOG | cut -c1-200 | head -20
bench() {  # preset op reference variants...
  local s=$1 op=$2; shift 2; local args=()
  for n in "$@"; do args+=(--variant $n); done
  timeout ${BT:-150} python3 -m specgen bench --shape $s --op $op "${args[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"
}
if [ -z "$NOBENCH" ]; then
  [ -n "$NOL2T" ] || bench layer2 fprop mmapersist_t34_r16x48_tf32 ${L2T-mmahwc_t34_r32x64_s2_v1_tf32 mmahwc_t17_r32x64_s2_v1_tf32 mmahwc_t34_r32x32_s2_v1_tf32 mmahwc_t34_r16x64_s2_v1_tf32 mmahwc_t34_r16x96_s1_v1_tf32}
  [ -n "$NOM2T" ] || bench mx-layer2 fprop mmapersist_t27_r24x64_tf32 ${M2T-mmahwc_t9_r24x80_s1_v1_tf32 mmahwc_t9_r24x48_s1_v1_tf32 mmahwc_t14_r24x64_s1_v1_tf32 mmahwc_t7_r24x64_s1_v1_tf32}
  [ -n "$NOL2B" ] || bench layer2-bf16 fprop mmahwc_t34_r16x64_s1_v1_bf16 ${L2B-mmahwc_t34_r32x64_s2_v1_bf16 mmahwc_t17_r32x64_s2_v1_bf16 mmahwc_t34_r32x32_s2_v1_bf16 mmahwc_t34_r16x64_s2_v1_bf16}
  [ -n "$NOL2D" ] || bench layer2-bf16 dgrad mmatoep_t40_r2x3_m4_bf16 ${L2D-mmahwc_t20_r16x96_s4_v1_bf16 mmahwc_t20_r16x32_s4_v1_bf16 mmahwc_t40_r16x32_s4_v1_bf16 mmahwc_t40_r32x32_s8_v1_bf16 mmahwc_t20_r32x16_s8_v1_bf16 mmahwc_t40_r8x64_s2_v1_bf16}
  [ -n "$NOM2D" ] || bench mx-layer2-bf16 dgrad mmahwc_t11_r16x96_s1_v1_bf16 ${M2D-mmahwc_t9_r24x80_s2_v1_bf16 mmahwc_t11_r24x48_s2_v1_bf16 mmahwc_t11_r24x32_s2_v1_bf16 mmahwc_t17_r24x48_s2_v1_bf16}
  grep -E "B=|^cudnn|^mma|not timed" $LOG | cut -c1-170
fi
for pov in $PROF; do s=${pov%%:*}; rest=${pov#*:}; op=${rest%%:*}; v=${rest#*:}
  timeout 200 ncu --kernel-name regex:^mmahwc --launch-skip 2 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats \
    python3 -m specgen bench --shape $s --op $op --batch 2000 --variant $v > $OUT/shift-prof-$s-$op.log 2>&1; echo "ncu $s $op rc=$?"
  grep -E "Duration|Throughput|Registers|Achieved Occ|Eligible|Pipe|Stall|Issued|Bank" $OUT/shift-prof-$s-$op.log | head -30
done
