# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test gpu-check bench generated docs format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Emit layer2 with tile 16 and verify it (numbers on a GPU, compile + resources without).
demo: $(STAMP)
	$(BIN)/specgen emit --shape layer2 --tile 16
	$(BIN)/specgen verify --shape layer2 --tile 16

# CPU tier everywhere; the GPU tier too where a GPU is present.
test: $(STAMP)
	$(BIN)/black --check specgen tests examples
	$(BIN)/pytest -q -n auto --dist worksteal

# Regenerate generated/ (the default variant set of every preset, every op), without
# the files of variants that left the set.
generated: $(STAMP)
	rm -f generated/*/*.cu
	$(BIN)/specgen emit --all-shapes --op all --all

# docs/strategies.md from the strategy table (a test fails when it is stale).
docs: $(STAMP)
	$(BIN)/specgen strategies --markdown > docs/strategies.md

format: $(STAMP)
	$(BIN)/black specgen tests examples

# On a GPU machine, from the source tree (no install): the GPU tier, verify, bench.
OUT ?= out
# Both steps run; the target fails if either did.
gpu-check:
	mkdir -p $(OUT)
	set -o pipefail; status=0; \
	PYTHONPATH=. $(PYTHON) -m pytest -q -m gpu tests $$($(PYTHON) -c 'import xdist' 2>/dev/null && printf -- '-n 8') 2>&1 | tee $(OUT)/pytest-gpu.log || status=1; \
	PYTHONPATH=. $(PYTHON) -m specgen verify --all-shapes --op all --all 2>&1 | tee $(OUT)/verify.log || status=1; \
	exit $$status

bench:
	mkdir -p $(OUT)
	set -o pipefail; PYTHONPATH=. $(PYTHON) -m specgen bench --all-shapes --best \
		--json $(OUT)/bench.json --plot $(OUT)/bench.png 2>&1 | tee $(OUT)/bench.log
	OUT=$(OUT) PYTHON=$(PYTHON) bash scripts/bench_backward.sh

clean:
	rm -rf $(VENV) .cache .pytest_cache
