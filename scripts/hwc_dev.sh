#!/bin/bash
# The twenty-second session's development runs (2026-11-24): mmahwc (16-bit tensor cores
# over a band spread pixel by pixel) verified on the 7x7 bf16 layers and on problems with
# odd channels, bias and activation, guarded rows and maps, then benched beside each
# preset's shipped winner and cuDNN.  NOBENCH=1 skips the benches; PROF=1 profiles the
# mx-layer2 forward and dgrad kernels.  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
LOG=$OUT/hwc-dev.log
[ -n "$NOVERIFY" ] || for sv in \
  "mx-layer2-bf16:fprop:" "mx-layer2-bf16:dgrad:" "layer2-bf16:fprop:" \
  "C=20,M=16,H=17,W=15,K=3,pad=1,dtype=bf16:fprop:" "C=20,M=16,H=17,W=15,K=3,pad=1,dtype=bf16:dgrad:" \
  "C=8,M=32,H=30,W=30,K=7,pad=3,dtype=bf16:fprop:" "C=8,M=32,H=30,W=30,K=7,pad=3,dtype=bf16:dgrad:" \
  "C=5,M=9,H=20,W=23,K=5,pad=2,bias=1,act=relu,dtype=fp16:fprop:mmahwc_t7_r16x32_fp16" \
  "C=13,M=12,H=11,W=9,K=3,pad=1,bias=1,dtype=bf16:fprop:mmahwc_t4_r16x16_bf16" \
  "C=12,M=24,H=33,W=33,K=7,pad=0,dtype=fp16:dgrad:mmahwc_t33_r16x32_fp16" ; do
  s=${sv%%:*}; rest=${sv#*:}; op=${rest%%:*}; n=${rest#*:}
  if [ -n "$n" ]; then sel=(--variant $n); else sel=(--strategy mmahwc); fi
  timeout 120 python3 -m specgen verify --shape "$s" --op $op "${sel[@]}" >> $LOG 2>&1; echo "verify $s $op $n rc=$?"
done
grep -E "FAIL|rror" $LOG | cut -c1-200 | head -20
if [ -z "$NOBENCH" ]; then
  F=${F-t27_r24x32 t27_r24x16 t27_r24x48 t27_r24x64 t14_r24x32 t9_r24x32}
  D=${D-t17_r16x64 t33_r16x64 t11_r16x64 t17_r16x32 t17_r16x48 t17_r8x64}
  L=${L-t34_r16x64 t34_r16x32 t17_r16x64 t34_r16x48 t12_r16x64}
  args=(--variant mmapersist_t27_r24x32_bf16); for n in $F; do args+=(--variant mmahwc_${n}_bf16); done
  timeout 240 python3 -m specgen bench --shape mx-layer2-bf16 "${args[@]}" >> $LOG 2>&1; echo "bench mx-layer2-bf16 fprop rc=$?"
  args=(--variant mmafold_t11_r12x2_yd_j2_bf16); for n in $D; do args+=(--variant mmahwc_${n}_bf16); done
  timeout 240 python3 -m specgen bench --shape mx-layer2-bf16 --op dgrad "${args[@]}" >> $LOG 2>&1; echo "bench mx-layer2-bf16 dgrad rc=$?"
  args=(--variant mmastrip_t34_r16x4_yd_bf16); for n in $L; do args+=(--variant mmahwc_${n}_bf16); done
  timeout 240 python3 -m specgen bench --shape layer2-bf16 "${args[@]}" >> $LOG 2>&1; echo "bench layer2-bf16 fprop rc=$?"
  grep -E "B=|^cudnn|^mma|not timed" $LOG | cut -c1-170
fi
if [ -n "$PROF" ]; then
  for ov in ${PV-fprop:mmahwc_t27_r24x64_bf16 dgrad:mmahwc_t11_r16x64_bf16}; do op=${ov%%:*}; v=${ov#*:}
    timeout 200 ncu --kernel-name regex:^mmahwc --launch-skip 2 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters \
      python3 -m specgen bench --shape mx-layer2-bf16 --op $op --batch 2000 --variant $v > $OUT/hwc-prof-$op.log 2>&1; echo "ncu $op rc=$?"
    grep -E "Duration|Throughput|Registers|Achieved Occ|Eligible|Pipe|Stall|Issued" $OUT/hwc-prof-$op.log | head -30
  done
fi
