set -x
export PYTHONPATH=.
python3 -m specgen verify --all-shapes --op all > $OUT/verify-all.log 2>&1; tail -3 $OUT/verify-all.log
grep -v "PASS" $OUT/verify-all.log | head -40
for spec in "C=8,M=12,H=13,W=11,K=3x2,stride=2x3,dil=2x1,pad=1x2x0x1,groups=2,bias=1,dtype=bf16,layout=nhwc" "C=6,M=4,H=9,W=10,K=3,stride=2,pad=1" "C=32,M=32,H=28,W=28,K=3,stride=2,pad=1,groups=32,dtype=fp16,layout=nhwc" "C=5,M=7,H=12,W=9,K=5x3,dil=2,pad=1x3"; do
  for op in dgrad wgrad bgrad; do python3 -m specgen verify --shape "$spec" --op $op 2>&1 | tail -n +3; done
done
python3 -m specgen verify --shape layer1 --op wgrad --batch 10000 2>&1 | tail -2
python3 -m specgen verify --shape mx-layer2 --op wgrad --batch 10000 2>&1 | tail -2
