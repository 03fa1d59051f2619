#!/bin/bash
# Twenty-sixth session: wgmma fed by TMA (a producer thread, tensor maps, mbarriers
# with transaction counts) beside the every-warp cp.async feed, on the wide layers'
# forward pass in bf16 and tf32 (`specgen bench --variant ...`, B=128, cuDNN in the
# same run), after the GPU tests of the new feed.  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG=$OUT/tma-dev-${STEP:-1}.log
b() { s=$1; op=$2; shift 2; a=(); for n in "$@"; do a+=(--variant $n); done
  timeout 200 python3 -m specgen bench --shape "$s" --op $op --batch 128 "${a[@]}" >> $LOG 2>&1; echo "bench $s $op rc=$?"; }
if [ "${STEP:-1}" = 1 ]; then
timeout ${TEST_LIMIT:-240} python3 -m pytest -q -m gpu tests/test_wgmma.py -k tma -p no:cacheprovider > $OUT/tma-tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/tma-tests.log | cut -c1-300
for s in ae-dec2-bf16 ae-enc2-bf16; do
b $s fprop wgmma_b256x128_p3_q1_gr_sy_bf16 wgmma_b256x128_p3_q1_gr_tma_bf16 wgmma_b256x128_p4_q1_gr_tma_bf16 wgmma_b256x128_p4_q2_gr_tma_bf16 wgmma_b256x128_p3_q2_gr_tma_bf16 wgmma_b128x128_p3_q2_gr_tma_bf16 wgmma_b128x128_p6_q2_gr_tma_bf16 wgmma_b128x256_p4_q2_gr_tma_bf16
done
T="H=16,W=16,K=3,pad=1,bias=1,layout=nhwc"
b "C=128,M=256,$T" fprop wgmma_b256x128_p3_q1_gr_sy_tf32 wgmma_b64x128_p3_q1_gr_sy_tf32 wgmma_b256x128_p4_q2_gr_tma_tf32 wgmma_b128x128_p4_q2_gr_tma_tf32 wgmma_b128x128_p3_q2_gr_tma_tf32 wgmma_b128x256_p4_q2_gr_tma_tf32
b "C=256,M=128,$T" fprop wgmma_b256x128_p3_q1_gr_sy_tf32 wgmma_b256x128_p4_q2_gr_tma_tf32 wgmma_b128x128_p3_q2_gr_tma_tf32
else
# the second round: dgrad through the forward view, and the tf32 defaults the fit now gives
for s in ae-dec2-bf16 ae-enc2-bf16; do
b $s dgrad wgmma_b256x128_p3_q1_gr_sy_bf16 wgmma_b256x128_p3_q1_gr_tma_bf16 wgmma_b256x128_p4_q2_gr_tma_bf16 wgmma_b128x256_p4_q2_gr_tma_bf16 wgmma_b128x128_p3_q2_gr_tma_bf16
done
T="H=16,W=16,K=3,pad=1,bias=1,layout=nhwc"
b "C=128,M=256,$T" fprop wgmma_b256x128_p3_q1_gr_tma_tf32 wgmma_b64x128_p3_q1_gr_tma_tf32 wgmma_b128x256_p3_q1_gr_tma_tf32
b "C=256,M=128,$T" fprop wgmma_b256x128_p3_q1_gr_tma_tf32 wgmma_b64x128_p3_q1_gr_tma_tf32
fi
grep -E "FAIL|rror" $LOG | cut -c1-200 | head
grep -E "B=|^cudnn|^wg|not timed" $LOG | cut -c1-150
