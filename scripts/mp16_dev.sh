#!/bin/bash
# mmapersist's fp16/bf16 kernel (m16n8k16, the band kept twice): verified on the 16-bit
# 7x7 presets' layers and on problems that exercise its edges (odd images, a pad, bias
# and relu, partial bands and map tiles, two octets a row, the channel loop, dgrad),
# then benched at B=10000 beside cuDNN.  Logs under $OUT.
export PYTHONPATH=.
V="timeout 120 python3 -m specgen verify --strategy mmapersist"
[ -n "${SKIP_VERIFY:-}" ] || while read -r spec batch extra; do
  for d in bf16 fp16; do
    $V --shape "$spec,dtype=$d" --precision $d --batch $batch $extra >> $OUT/mp16-verify.log 2>&1
    echo "verify $spec $d $extra rc=$?"; tail -1 $OUT/mp16-verify.log | cut -c1-160
  done
done <<'LIST'
C=1,M=4,H=86,W=86,K=7 1000
C=4,M=16,H=40,W=40,K=7 1000
C=1,M=12,H=72,W=72,K=7 500
C=12,M=24,H=33,W=33,K=7 256
C=3,M=10,H=17,W=15,K=5,pad=2,bias=1,act=relu 33
C=3,M=10,H=17,W=15,K=5,pad=2,bias=1 33 --tile 4
C=5,M=20,H=23,W=19,K=9,pad=4 17
C=7,M=3,H=12,W=13,K=3,pad=1 9
C=4,M=16,H=40,W=40,K=7,op=dgrad 100
LIST
grep -c PASS $OUT/mp16-verify.log; grep -E "FAIL|rror" $OUT/mp16-verify.log | head -5 | cut -c1-300
for s in "C=1,M=4,H=86,W=86,K=7" "C=4,M=16,H=40,W=40,K=7" "C=1,M=12,H=72,W=72,K=7" "C=12,M=24,H=33,W=33,K=7"; do
  for d in bf16 fp16; do
    v=$(python3 -c "
from specgen.shapes import parse_shape; from specgen.strategies import BY_KEY; from specgen.variants import Precision
p=parse_shape('$s,dtype=$d'); c=BY_KEY['mmapersist']; print(c.fit(p, c(precision=Precision('$d'))).name)")
    timeout 120 python3 -m specgen bench --shape "$s,dtype=$d" --batch 10000 --variant $v >> $OUT/mp16-bench.log 2>&1
    echo "bench $s $d rc=$?"; grep -E "^cudnn|^mmapersist" $OUT/mp16-bench.log | tail -5 | cut -c1-110
  done
done
