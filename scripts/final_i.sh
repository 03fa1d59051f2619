#!/bin/bash
# The GPU checks after wtap's row splits a lane a sum, its mbarrier ring and its last
# step cut to the row (fp32 wgrad; 2026-11-24): scripts/final_h.sh with OP=wgrad
# (STEP=check, tier or drawn).
OP=wgrad exec bash "$(dirname "$0")/final_h.sh"
