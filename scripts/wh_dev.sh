#!/bin/bash
# Development pass of tcwhalo (wgrad of few-channel 16-bit layers) on the GPU: its GPU
# tests, then the autoencoder's 3-channel layers at B=128 beside cuDNN and wband (the
# strategy they had).  ENC1 / DEC3 name extra variants (without the dtype); logs under $OUT.
set -u
export PYTHONPATH=.
out=${OUT:-/tmp}
timeout ${TEST_LIMIT:-300} python3 -m pytest -q -m gpu tests/test_tcwhalo.py ${TESTS:-} -p no:cacheprovider > $out/pytest-tcwhalo.log 2>&1
echo "tests rc=$?"; tail -3 $out/pytest-tcwhalo.log | cut -c1-300; grep -E "^E .*(assert|Error)" $out/pytest-tcwhalo.log | head -5 | cut -c1-300
enc1="C=3,M=256,H=32,W=32,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad"
dec3="C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad"
# the wide layers' wgrad with db (tcwgrad), as the autoencoder runs them
enc2="C=256,M=128,H=16,W=16,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad"
dec2="C=128,M=256,H=16,W=16,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad"
for which in enc1 dec3 ${WIDE:-}; do
  spec=${!which}
  if [ $which = enc1 ]; then V="wband_t32_m8_p4_w1_s11_fp32 tcwhalo_b128x8_w8x1_r2_p3_s132 ${ENC1:-}"
  elif [ $which = dec3 ]; then V="wband_t32_m3_p4_w1_s4_fp32 tcwhalo_b16x64_w1x8_r2_p3_s66 ${DEC3:-}"
  else V="tcwgrad_b128x128_w2x2_k32_p4_s14"; fi
  args=""; for v in $V; do [[ $v == *_fp32 ]] && args="$args --variant $v" || args="$args --variant ${v}_bf16"; done
  echo "== $which"
  timeout 120 python3 -m specgen bench --shape "$spec" --batch 128 $args 2>&1 | tail -14 | cut -c1-130
done > $out/bench-tcwhalo.log 2>&1
cat $out/bench-tcwhalo.log
# PROFILE="<spec-name>:<variant> ..." (spec-name enc1 or dec3, variant without dtype):
# stall reasons, pipes, DRAM and occupancy of one launch after warm-up.
for pv in ${PROFILE:-}; do
  which=${pv%%:*}; v=${pv#*:}; spec=${!which}
  ncu --clock-control none -k "regex:${v}_bf16_wgrad_iobf16_nhwc$" -s 3 -c 1 \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem" \
    python3 -m specgen bench --shape "$spec" --batch 128 --variant ${v}_bf16 > $out/prof-$which-$v.log 2>&1
  echo "== $which $v"; grep -E "stalled|hmma|issue_active|duration|wavefronts|dram__|warps_active|conflicts|hit_rate|launch__" $out/prof-$which-$v.log | awk '$NF+0 > 0.1 || /hmma|duration|issue_active|wavefronts|launch__|hit_rate/' | sed 's/  */ /g'
done
