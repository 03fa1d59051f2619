#!/bin/bash
# Development pass of the 16-bit tensor-core strategies (wgmma, tcgemm) on the GPU:
# verify drawn-style problems one variant at a time, time the autoencoder's wide layers
# beside cuDNN and a tcgemm baseline (TCGEMM=<variant>), and (PROFILE=<variant>) profile
# one kernel with Nsight Compute.  VARIANTS names them without the dtype; logs under $OUT.
# (It replaces tc_dev.sh, which passed several --variant to verify, which checks one.)
set -u
export PYTHONPATH=.
out=${OUT:-/tmp}
sg="python3 -m specgen"
V="${VARIANTS:-wgmma_b256x128_p4 wgmma_b128x128_p4 wgmma_b128x128_p6 wgmma_b256x64_p4 wgmma_b192x128_p4 wgmma_b256x128_p3}"
for dt in bf16 fp16; do
  for spec in \
    "C=256,M=128,H=16,W=16,K=3,pad=1,dtype=$dt,layout=nhwc" \
    "C=24,M=40,H=9,W=11,K=3,pad=2,stride=2,dil=2,dtype=$dt,layout=nhwc" \
    "C=48,M=48,H=13,W=10,K=5,pad=1,groups=3,dtype=$dt,layout=nhwc,bias=1,act=relu" \
    "C=72,M=136,H=7,W=9,K=3,pad=1,dtype=$dt,layout=nhwc,bias=1" \
    "C=128,M=128,H=8,W=8,K=3,pad=1,dtype=$dt,layout=nhwc,op=dgrad" ; do
    for v in $V; do
      $sg verify --shape "$spec" --variant ${v}_$dt --batch 5 2>&1 | grep -E "PASS|FAIL|ERROR|rror"
    done
  done
done > $out/verify.log 2>&1
echo "verify: $(grep -c PASS $out/verify.log) passed"; grep -v PASS $out/verify.log | head
for shape in ae-enc2-bf16 ae-dec2-bf16; do
  args="--variant ${TCGEMM:-tcgemm_b128x128_w2x2_k32_p4}_bf16"; for v in $V; do args="$args --variant ${v}_bf16"; done
  $sg bench --shape $shape $args 2>&1 | tail -12
done > $out/bench.log 2>&1
cut -c1-120 $out/bench.log
if [ -n "${PROFILE:-}" ]; then
  ncu --clock-control none -k "regex:$PROFILE" -s 5 -c 1 --section SpeedOfLight --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    python3 -m specgen bench --shape ae-enc2-bf16 --variant ${PROFILE}_bf16 > $out/ncu.log 2>&1
  grep -E "Duration|Throughput|Pipe|Stall|Warp Cycles|Registers|Achieved Occupancy|Bank|Issued|Eligible|No Eligible|Shared" $out/ncu.log | head -60
fi
