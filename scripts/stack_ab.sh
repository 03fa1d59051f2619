#!/bin/bash
# Twenty-fourth session: mmahwc's stacks on the H100/H200, then the same with the k-step loop unrolled by
# two (an A/B through the template, which the run's copy only sees), and a full profile.
export PYTHONPATH=. PYTHONUNBUFFERED=1
b() { s=$1; op=$2; shift 2; a=(); for n in "$@"; do a+=(--variant $n); done; timeout 150 python3 -m specgen bench --shape $s --op $op "${a[@]}" 2>&1 | grep -E "B=|^cudnn|^mma|FAIL|rror" | cut -c1-150; }
M="mmahwc_t14_r24x80_s1_v1_bf16 mmahwc_t27_r24x16_s1_v3_bf16 mmahwc_t27_r8x16_s1_v3_bf16 mmahwc_t18_r24x16_s1_v3_bf16"
L="mmahwc_t20_r8x16_s2_v4_bf16 mmahwc_t40_r8x16_s2_v4_bf16 mmahwc_t40_r8x16_s2_v2_bf16 mmahwc_t20_r8x16_s2_v2_bf16"
b mx-layer2-bf16 fprop $M; b layer2-bf16 dgrad $L
timeout 200 ncu --set full --kernel-name regex:^mmahwc --launch-skip 2 --launch-count 1 python3 -m specgen bench --shape mx-layer2-bf16 --batch 2000 --variant mmahwc_t27_r24x16_s1_v3_bf16 > $OUT/prof-m2b-v3.log 2>&1; echo ncu rc=$?
grep -E "Duration|Throughput|Registers Per|Achieved Occ|Eligible|Issued Ipc|Stall|stall" $OUT/prof-m2b-v3.log | head -40
python3 - <<'P'
p='templates/gemm/mmahwc.cu.j2'; s=open(p).read()
o='#pragma unroll 1\n            for (int s = 0; s < {{ kr }}; ++s) {'
assert o in s; s=s.replace(o,'#pragma unroll 2\n            for (int s = 0; s < {{ kr }}; ++s) {'); open(p,'w').write(s)
P
echo "== s unrolled by 2"
b mx-layer2-bf16 fprop mmahwc_t27_r24x16_s1_v3_bf16 mmahwc_t27_r8x16_s1_v3_bf16; b layer2-bf16 dgrad mmahwc_t20_r8x16_s2_v4_bf16 mmahwc_t40_r8x16_s2_v4_bf16
