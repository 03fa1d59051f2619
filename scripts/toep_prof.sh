#!/bin/bash
# Nsight Compute on mmatoep (layer2's and mx-layer1's bf16 dgrad at B=10000, one launch
# after warm-up): the full set's headline counters and stall reasons; then more variants
# benched beside cuDNN bf16 and the shipped winners.  Logs under $OUT.
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
for pair in "layer2-bf16 mmatoep_t40_r2x3_m4_bf16_dgrad_iobf16" "mx-layer1-bf16 mmatoep_t24_r1x3_m1_bf16_dgrad_iobf16"; do
  set -- $pair
  timeout 200 ncu --clock-control none -k "regex:mmatoep.*dgrad_iobf16$" -s 3 -c 1 --set full --import-source no \
    --page details --print-details all \
    python3 -m specgen bench --shape $1 --op dgrad --variant $2 > $OUT/toep-prof-$1.log 2>&1
  echo "full $1 rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|Tensor|No Eligible|Eligible Warps|Executed Ipc|L1/TEX Hit|Shared" $OUT/toep-prof-$1.log | head -60 | sed 's/  */ /g'
done
(cd $OUT && gzip -f toep-prof-*.log)
LOG=$OUT/toep-dev2.log
b() { s=$1; op=$2; tag=$3; shift 3; args=(); for v in "$@"; do args+=(--variant ${v}${tag}); done
  timeout 150 python3 -m specgen bench --shape $s --op $op "${args[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"; }
T=mmatoep_
b layer1-bf16 fprop _iobf16 mmafold_t80_r4x4_yd_j2_bf16 ${T}t80_r4x4_m4_bf16 ${T}t80_r2x5_m4_bf16 ${T}t80_r1x5_m4_bf16 ${T}t40_r2x5_m4_bf16
b mx-layer1-bf16 dgrad _dgrad_iobf16 ${T}t16_r1x3_m1_bf16 ${T}t16_r1x5_m1_bf16 ${T}t24_r1x4_m1_bf16 ${T}t18_r1x5_m1_bf16
b layer2-bf16 dgrad _dgrad_iobf16 ${T}t40_r2x5_m4_bf16 ${T}t40_r2x5_m2_bf16 ${T}t40_r2x3_m2_bf16 ${T}t34_r2x3_m4_bf16
grep -E "B=|^cudnn|^mma|not timed|rror" $LOG | cut -c1-125
