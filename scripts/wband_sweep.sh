set -o pipefail
export PYTHONPATH=.
b() { python3 -m specgen bench --shape $1 --op wgrad "${@:2}" 2>&1 | grep -E "B=|cudnn-fp32|wband" | cut -c1-110; }
b layer1 --variant wband_t20_m4_p4_w2_s1056_fp32_wgrad --variant wband_t20_m4_p4_w1_s1056_fp32_wgrad --variant wband_t10_m4_p4_w2_s1056_fp32_wgrad --variant wband_t40_m4_p4_w1_s1056_fp32_wgrad
b layer2 --variant wband_t34_m8_p4_w1_s132_fp32_wgrad --variant wband_t17_m8_p2_w1_s132_fp32_wgrad --variant wband_t17_m8_p4_w1_s132_fp32_wgrad --variant wband_t34_m8_p2_w1_s132_fp32_wgrad
b mx-layer1 --variant wband_t17_m6_p4_w2_s528_fp32_wgrad --variant wband_t9_m6_p2_w1_s528_fp32_wgrad --variant wband_t17_m6_p4_w1_s528_fp32_wgrad --variant wband_t33_m6_p4_w1_s528_fp32_wgrad
b mx-layer2 --variant wband_t27_m8_p4_w1_s29_fp32_wgrad --variant wband_t14_m4_p8_w1_s29_fp32_wgrad --variant wband_t27_m4_p4_w1_s29_fp32_wgrad
