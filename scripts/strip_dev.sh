#!/bin/bash
# mmastrip (fp16/bf16 strips of output rows): verified on the 16-bit 7x7 presets' layers
# and on problems that exercise its edges, then candidates benched at B=10000 beside
# mmapersist and cuDNN.  SKIP_VERIFY=1 skips the first part.  Logs under $OUT.
export PYTHONPATH=.
V="timeout 120 python3 -m specgen verify --strategy mmastrip"
[ -n "${SKIP_VERIFY:-}" ] || while read -r spec batch extra; do
  for d in bf16 fp16; do
    $V --shape "$spec,dtype=$d" --precision $d --batch $batch $extra >> $OUT/strip-verify.log 2>&1
    echo "verify $spec $d $extra rc=$?"; tail -1 $OUT/strip-verify.log | cut -c1-160
  done
done <<'LIST'
C=1,M=4,H=86,W=86,K=7 1000
C=4,M=16,H=40,W=40,K=7 1000
C=1,M=12,H=72,W=72,K=7 500
C=12,M=24,H=33,W=33,K=7 256
C=3,M=10,H=17,W=15,K=5,pad=2,bias=1,act=relu 33
C=3,M=10,H=17,W=16,K=5,pad=2,bias=1 33 --tile 5
C=5,M=20,H=23,W=19,K=9,pad=4 17
C=7,M=3,H=12,W=13,K=3,pad=1 9
C=2,M=9,H=20,W=22,K=3,pad=1,act=relu 21 --tile 7
C=2,M=11,H=24,W=22,K=5,pad=1 5
C=4,M=16,H=40,W=40,K=7,op=dgrad 100
LIST
# The staged output (ys) where Wo is even: odd phases of the runs, bands cut short,
# column tiles past Wo, a dgrad view.
[ -n "${SKIP_VERIFY:-}" ] || while read -r spec batch extra; do
  for d in bf16 fp16; do
    $V --shape "$spec,dtype=$d" --precision $d --batch $batch --stage-output $extra >> $OUT/strip-verify.log 2>&1
    echo "verify ys $spec $d $extra rc=$?"; tail -1 $OUT/strip-verify.log | cut -c1-160
  done
done <<'LIST'
C=1,M=4,H=86,W=86,K=7 1000
C=4,M=16,H=40,W=40,K=7 1000
C=1,M=12,H=72,W=72,K=7 500 --tile 33
C=2,M=9,H=20,W=22,K=3,pad=1,act=relu 21 --tile 7
C=3,M=10,H=17,W=16,K=5,pad=2,bias=1 33 --tile 5
C=2,M=3,H=13,W=12,K=5,pad=1 7
C=2,M=11,H=24,W=22,K=5,pad=1,bias=1 5 --tile 11
C=4,M=16,H=40,W=40,K=7,op=dgrad 100
LIST
grep -c PASS $OUT/strip-verify.log; grep -E "FAIL|rror" $OUT/strip-verify.log | head -5 | cut -c1-300
B="timeout 150 python3 -m specgen bench --batch 10000"
while read -r spec variants; do
  args=""; for v in $variants; do args="$args --variant $v"; done
  $B --shape "$spec,dtype=bf16" $args >> $OUT/strip-bench.log 2>&1
  echo "bench $spec rc=$?"; grep -E "^cudnn-bf16|^mma" $OUT/strip-bench.log | tail -$(( $(echo $variants | wc -w) + 1 )) | cut -c1-100
done <<'LIST'
C=1,M=4,H=86,W=86,K=7 mmastrip_t80_r8x10_yd_bf16
C=4,M=16,H=40,W=40,K=7 mmastrip_t34_r8x4_yd_bf16 mmastrip_t34_r16x4_yd_bf16 mmastrip_t34_r8x6_yd_bf16 mmastrip_t34_r16x6_yd_bf16 mmastrip_t34_r8x4_ys_bf16 mmastrip_t34_r8x8_yd_bf16
C=1,M=12,H=72,W=72,K=7 mmastrip_t33_r16x6_ys_bf16 mmastrip_t66_r16x6_yd_bf16 mmastrip_t33_r8x6_ys_bf16 mmastrip_t33_r16x4_ys_bf16 mmastrip_t22_r16x6_ys_bf16 mmastrip_t33_r8x10_ys_bf16
LIST
