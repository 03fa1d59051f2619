#!/bin/bash
# Development pass of the tcgemm strategy on the GPU: verify drawn problems, time the
# autoencoder's wide layers beside cuDNN, profile one kernel.  Logs under $OUT.
set -u
export PYTHONPATH=.
out=${OUT:-/tmp}
sg="python3 -m specgen"
V="${VARIANTS:-tcgemm_b128x128_w2x2_k32_p4 tcgemm_b128x256_w2x4_k32_p4 tcgemm_b256x128_w4x2_k32_p4 tcgemm_b128x128_w2x4_k64_p4 tcgemm_b64x128_w2x2_k64_p3 tcgemm_b128x128_w2x2_k32_p3 tcgemm_b128x64_w2x2_k64_p4}"
for dt in bf16 fp16; do
  for spec in \
    "C=256,M=128,H=16,W=16,K=3,pad=1,dtype=$dt,layout=nhwc" \
    "C=24,M=40,H=9,W=11,K=3,pad=2,stride=2,dil=2,dtype=$dt,layout=nhwc" \
    "C=48,M=36,H=13,W=10,K=5,pad=1,groups=3,dtype=$dt,layout=nhwc,bias=1,act=relu" \
    "C=128,M=128,H=8,W=8,K=3,pad=1,dtype=$dt,layout=nhwc,op=dgrad" ; do
    args=""; for v in $V; do args="$args --variant ${v}_$dt"; done
    $sg verify --shape "$spec" $args --batch 5 2>&1 | grep -E "PASS|FAIL|ERROR|verify:"
  done
done > $out/verify.log 2>&1
grep -c PASS $out/verify.log; grep -v PASS $out/verify.log | head
b=128
for spec in "C=256,M=128,H=16,W=16,K=3,pad=1" "C=128,M=256,H=16,W=16,K=3,pad=1" "C=128,M=128,H=8,W=8,K=3,pad=1"; do
  args=""; for v in $V; do args="$args --variant ${v}_bf16"; done
  $sg bench --shape "$spec,dtype=bf16,layout=nhwc" --batch $b $args 2>&1 | tail -10
done > $out/bench.log 2>&1
cat $out/bench.log | cut -c1-110
if [ -n "${PROFILE:-}" ]; then
  ncu --clock-control none -k "regex:$PROFILE" -c 1 --section SpeedOfLight --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    python3 -m specgen bench --shape "C=256,M=128,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc" --batch 128 \
    --variant ${PROFILE}_bf16 > $out/ncu.log 2>&1
  grep -E "Duration|Throughput|Pipe|Stall|Warp Cycles|Registers|Achieved Occupancy|Bank|Issued|Eligible|No Eligible|Shared" $out/ncu.log | head -60
fi
