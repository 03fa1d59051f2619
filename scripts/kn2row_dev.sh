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
else
# the second round: the default (w10) on the GPU tier, the new preset's default sets for
# every op verified and benched (its shipped winners), and the bf16 training step with
# the GPU's busy time against its span (issue 14's back-to-back question)
timeout ${TEST_LIMIT:-200} python3 -m pytest -q -m gpu tests/test_kn2row.py -p no:cacheprovider > $OUT/kn2row-tests-2.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/kn2row-tests-2.log | cut -c1-300
timeout 150 python3 -m specgen verify --shape ae-dec3-bf16 --op all > $OUT/verify-ae-dec3-bf16.log 2>&1
echo "verify rc=$?"; tail -3 $OUT/verify-ae-dec3-bf16.log
for op in fprop dgrad wgrad; do
  timeout 150 python3 -m specgen bench --shape ae-dec3-bf16 --op $op > $OUT/bench-ae-dec3-bf16-$op.log 2>&1
  echo "bench $op rc=$?"; grep -E "^cudnn-bf16|verified|not timed" $OUT/bench-ae-dec3-bf16-$op.log | sort -k3 -n | head -8 | cut -c1-130
done
timeout 150 python3 scripts/step_timeline.py --math bf16 > $OUT/timeline-bf16.log 2>&1; echo "timeline rc=$?"; cat $OUT/timeline-bf16.log | head -40
timeout 200 python3 examples/autoencoder.py --channels-last --steps 10 --timed 50 > $OUT/autoencoder.log 2>&1; echo "autoencoder rc=$?"; tail -12 $OUT/autoencoder.log
fi
grep -E "FAIL|rror" $LOG | cut -c1-200 | head
grep -E "B=|^cudnn|^kn2|^flane|^tcg|^mma|not timed" $LOG | cut -c1-150
