# The backward passes with 16-bit tensors (bf16, NHWC) beside cuDNN bf16: layer2's and
# ae-enc2's layers at their presets' batches (logs under $OUT).
export PYTHONPATH=.
P=${PYTHON:-python3}
L2="C=4,M=16,H=40,W=40,K=7,dtype=bf16,layout=nhwc"
E2="C=256,M=128,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc"
b() { $P -m specgen bench "$@" 2>&1 | grep -E "B=|cudnn-bf16|_dgrad|_wgrad" | cut -c1-120; }
b --shape $L2 --op wgrad --batch 10000
b --shape $L2 --op dgrad --batch 10000 --variant stream_t40_m4_c2_r4x8_fp32_dgrad_iobf16_nhwc --variant persist_t27_r4x10_fp32_dgrad_iobf16_nhwc --variant phased_t4_m4_wconst_fp32_dgrad_iobf16_nhwc
b --shape $E2 --op dgrad --batch 128 --variant mma_t64_bf16_dgrad_iobf16_nhwc --variant stream_t8_m128_c8_r8x8_fp32_dgrad_iobf16_nhwc
b --shape $E2 --op wgrad --batch 128
