# Tune the narrow presets' backward passes on the GPU present (logs under $OUT).
export PYTHONPATH=.
t() { ${PYTHON:-python3} -m specgen tune --budget ${BUDGET:-12} "$@" 2>&1 | grep -v "verified/timed" | tail -8; }
for s in layer1 layer2 mx-layer1 mx-layer2; do t --shape $s --op wgrad --strategy wband; done
for s in layer2 mx-layer2; do t --shape $s --op dgrad --strategy persist; done
for s in layer1 mx-layer1; do t --shape $s --op dgrad --strategy stream; done
