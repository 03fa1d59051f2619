#!/bin/bash
# The 16-bit forward of the autoencoder's small layers (ae-enc1, ae-dec3, ae-dec1 in bf16
# NHWC, B=128) on their default tensor-core kernels beside cuDNN in the same run
# (`specgen bench --variant ...`), to check issue 13's "<= cuDNN" rows after the TMA
# feed (twenty-sixth session).  Logs under $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
b() { s=$1; shift; a=(); for n in "$@"; do a+=(--variant $n); done
  timeout 100 python3 -m specgen bench --shape "$s,K=3,pad=1,dtype=bf16,layout=nhwc" --batch 128 "${a[@]}" > $OUT/small16-${s//[=,]/}.log 2>&1
  echo "$s rc=$?"; grep -E "^cudnn-bf16|^(mma|tcgemm|wgmma|mmapersist)|not timed" $OUT/small16-${s//[=,]/}.log | cut -c1-130; }
b C=3,M=256,H=32,W=32 mma_t64_bf16
b C=256,M=3,H=32,W=32 tcgemm_b128x16_w2x1_k32_p4_bf16
b C=128,M=128,H=8,W=8 wgmma_b64x128_p3_q1_gr_tma_bf16 tcgemm_b64x128_w2x2_k32_p4_bf16
