#!/bin/bash
# Twenty-seventh session: kn2row (taps as GEMM columns, then a shift-add) on the
# autoencoder's 256 -> 3 layer in 16 bits: its GPU tests, then its variants beside
# flane, tcgemm and cuDNN in the same run (`specgen bench --variant ...`, B=128), for
# the forward pass in bf16 and fp16 and for ae-enc1's dgrad (the same GEMM view).
# Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=$OUT/kn2row-dev-${STEP:-1}.log
b() { s=$1; op=$2; shift 2; a=(); for n in "$@"; do a+=(--variant $n); done
  timeout 200 python3 -m specgen bench --shape "$s" --op $op --batch 128 "${a[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"; }
T="H=32,W=32,K=3,pad=1,layout=nhwc"
if [ "${STEP:-1}" = 1 ]; then
timeout ${TEST_LIMIT:-200} python3 -m pytest -q -m gpu tests/test_kn2row.py -p no:cacheprovider > $OUT/kn2row-tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/kn2row-tests.log | cut -c1-300
K="kn2row_r8_w5_k32_p4 kn2row_r8_w10_k32_p4 kn2row_r8_w5_k64_p3 kn2row_r8_w10_k64_p3 kn2row_r4_w3_k32_p4 kn2row_r4_w6_k32_p4 kn2row_r4_w6_k64_p4 kn2row_r16_w9_k32_p3 kn2row_r8_w5_k32_p3 kn2row_r8_w5_k32_p2 kn2row_r2_w4_k64_p4 kn2row_r4_w6_k32_p8"
b "C=256,M=3,$T,dtype=bf16" fprop $(for k in $K; do echo ${k}_bf16; done) flane_w4_p8_g528_fp32 tcgemm_b128x16_w2x1_k32_p4_bf16
b "C=256,M=3,$T,dtype=fp16" fprop kn2row_r8_w5_k32_p4_fp16 kn2row_r4_w6_k32_p4_fp16 kn2row_r8_w10_k32_p4_fp16 flane_w4_p8_g528_fp32
b "C=3,M=256,$T,dtype=bf16" dgrad kn2row_r8_w5_k32_p4_bf16 kn2row_r4_w6_k32_p4_bf16 kn2row_r8_w10_k32_p4_bf16
fi
grep -E "FAIL|rror" $LOG | cut -c1-200 | head
grep -E "B=|^cudnn|^kn2|^flane|^tcg|^mma|not timed" $LOG | cut -c1-150
