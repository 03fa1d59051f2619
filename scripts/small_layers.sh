#!/bin/bash
# The autoencoder's other layers as bf16 channels_last problems (B=128), specgen's
# default sets beside cuDNN: ae-dec1 (forward, dgrad), ae-enc1 and ae-dec3 (forward).
export PYTHONPATH=.
for spec in "C=128,M=128,H=8,W=8,K=3,pad=1,bias=1,act=relu" "C=3,M=256,H=32,W=32,K=3,pad=1,bias=1,act=relu" "C=256,M=3,H=32,W=32,K=3,pad=1,bias=1"; do
  for op in fprop dgrad; do
    [ "$op" = dgrad ] && [[ "$spec" != C=128* ]] && continue
    s="$spec,dtype=bf16,layout=nhwc"; [ "$op" = dgrad ] && s="${s/,bias=1,act=relu/},op=dgrad"
    echo "== $s"
    timeout 90 python3 -m specgen bench --shape "$s" --batch 128 2>&1 | grep -E "cudnn|verif|floor" | cut -c1-118
  done
done
