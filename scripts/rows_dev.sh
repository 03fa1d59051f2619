#!/bin/bash
# Thirtieth session: mmarows (one map's window rows on the n side) on the one-channel
# layers' bf16 dgrad views, benched beside the shipped winners and cuDNN in the same run
# (`specgen bench --variant ...`, B=10000; every row verified first), then profiled and
# tested.  STEP=prof adds Nsight Compute on one (PV).  The second round (after 32-bit
# shared addresses with literal offsets and a stage's rows' mma chains side by side) is
# the same command.  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=$OUT/rows-dev.log
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
b() { s=$1; op=$2; shift 2; a=(); for n in "$@"; do a+=(--variant $n); done
  timeout 200 python3 -m specgen bench --shape $s --op $op "${a[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"; }
R="mmarows_i1_r2_bf16 mmarows_i1_r4_bf16 mmarows_i1_r8_bf16 mmarows_i2_r2_bf16 mmarows_i2_r4_bf16 mmarows_i2_r8_bf16"
b mx-layer1-bf16 dgrad mmahwc_t18_r8x16_s8_v6_k3_bf16 $R
b layer1-bf16 dgrad mmatoep_t43_r1x6_m1_bf16 $R
grep -E "FAIL|rror" $LOG | cut -c1-200 | head
grep -E "B=|^cudnn|^mm|not timed" $LOG | cut -c1-150
if [ "${STEP:-}" = prof ]; then
  timeout 150 ncu --clock-control none -k "regex:mmarows.*dgrad_iobf16$" -s 3 -c 1 --set full --import-source no \
    --page details --print-details all \
    python3 -m specgen bench --shape mx-layer1-bf16 --op dgrad --batch 2000 --variant ${PV:-mmarows_i1_r4_bf16} > $OUT/rows-prof.log 2>&1
  echo "prof rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Tensor|No Eligible|Eligible Warps|Shared|Bank|Block Limit" $OUT/rows-prof.log | head -40 | sed 's/  */ /g'
  gzip -f $OUT/rows-prof.log
fi
timeout ${LT:-200} python3 -m pytest -q -m gpu tests/test_mmarows.py -p no:cacheprovider -x > $OUT/rows-tests.log 2>&1
echo "tests rc=$?"; tail -4 $OUT/rows-tests.log | cut -c1-400
