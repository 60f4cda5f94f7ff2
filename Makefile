# Two commands do all the setup on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test train train-core train-phase2 phase2-flags train-selfspec distill clean cpp

# The packages go in with uv (from PyPI, pinned, into the venv): on 2 cores it installs the ~100
# packages in ~15 s where pip took ~125 s with an empty cache, most of `make test`'s setup. uv reads
# no pip configuration: a pip find-links (a local wheel folder, such as one holding the CPU torch)
# is handed to it as UV_FIND_LINKS.
$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv==0.13.10
	links="$${UV_FIND_LINKS:-$${PIP_FIND_LINKS:-$$($(PY) -m pip config get global.find-links 2>/dev/null)}}"; \
	  UV_FIND_LINKS="$$links" $(VENV)/bin/uv pip install --python $(PY) -q -c constraints-cpu.txt -e '.[export,dev,serve]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dllm-deploy demo

# get_cross_tools.sh: the aarch64 cross compiler, qemu-user and the arm64 libpython from Debian, where
# missing and root (tests/integration/cpp/test_aarch64.py skips without them). The C++ tests' other builds (the
# AddressSanitizer one, and the aarch64 one where the cross compiler is) are made before pytest on
# both cores: inside pytest one worker built them while the other sat waiting for them.
# lint-imports: the module layers of docs/architecture.md ([tool.importlinter] in pyproject.toml).
# pytest runs a worker per core (pytest-xdist), each test file on one worker (its module fixtures
# built once); TEST_WORKERS=0 runs the suite in this process. tests/pytest_cpu.py records and sums
# the CPU each test takes (the suite is CPU-bound on 2 cores: its docstring says how to run it).
TEST_WORKERS ?= auto
test: $(STAMP) cpp
	bash cpp/scripts/get_cross_tools.sh
	PYTHON=$(abspath $(PY)) cpp/scripts/build.sh asan dllm-generate dllm-stream-check
	if command -v aarch64-linux-gnu-g++ >/dev/null; then PYTHON=$(abspath $(PY)) cpp/scripts/build.sh aarch64; fi
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# The C/C++ embedding (docs/cpp.md): ONNX Runtime headers + library into build/onnxruntime,
# then libdllm_deploy.so, dllm-generate and dllm-embed into build/cpp (`make test` adds an
# AddressSanitizer build in build/cpp-asan with `cpp/scripts/build.sh asan`); ctest then rebuilds
# every golden plan of tests/data/golden with cpp/src/canvas.cpp and compares it exactly.
cpp: $(STAMP)
	PYTHON=$(abspath $(PY)) cpp/scripts/build.sh release
	ctest --test-dir build/cpp --output-on-failure

# Retrain the bundled tiny dLLM with the committed recipe (docs/training.md; not part of CI): five
# runs on the broad task inputs (--dist train: half the core vocabulary, half random words and
# lengths), all on 2 CPU cores. A: autoregressive warm-up on the whole mix, stopped after 4500 steps;
# B: a copy-heavy warm-up (where the copy circuit forms), then block diffusion; C, D, E: more block
# diffusion with other family weights. Each run is stopped and annealed by its wall-clock limit
# (--time-limit with --anneal-by-time), so a faster or slower machine takes other step counts and
# gives other weights; about 4.3 hours in all. AUTOCAST=none on a CPU without AMX / AVX512-BF16,
# where bf16 autocast is slower than fp32. The runs go to build/train-broad/, and E's files into the package.
# `make train-core` retrains the closed-vocabulary weights of lab/tiny-core (phase 1: 86
# minutes on 2 CPU cores, 5.4 minutes on one H200, where the committed phase 1 was trained; phase
# 2: 52 CPU-minutes); `make train-phase2` runs its phase 2 alone on that folder's weights;
# tests/gpu/train_candidates.sh reads phase 2's flags from `make -s phase2-flags`.
DEVICE   ?= cpu
AUTOCAST ?= bf16
TINY     := dllm_deploy/models/tiny
CORE     := lab/tiny-core
BROAD    := build/train-broad
BROAD_FLAGS := --dist train --steps 40000 --anneal-by-time --device $(DEVICE)
MIX_A := count=3,reverse=2,upper=1.2,kv=1,csv=0.8,letter=0.4,text=0.5
PHASE2_FLAGS := --seed 1 --batch 8 --lr 3e-4 --steps 8000 --ar-steps 0 \
                --mix count=3,reverse=2,upper=1.2,kv=1,csv=0.8,letter=0.4,text=0.5
DISTILL_FLAGS := --dist core --entropy-weight 0 --steps 2900 --batch 8 --lr 1e-4 --seed 0 --teacher-prompts 256 --threads 2
train: $(STAMP)
	$(VENV)/bin/dllm-deploy train --out $(BROAD)/A $(BROAD_FLAGS) --seed 0 --batch 16 --lr 1e-3 \
	  --ar-steps 6000 --ar-until-loss 0.3 --ar-margin 1200 --mix $(MIX_A) --time-limit 5700 --stop-after 4500 --autocast $(AUTOCAST)
	$(VENV)/bin/dllm-deploy train --out $(BROAD)/B --init-from $(BROAD)/A $(BROAD_FLAGS) --seed 2 --batch 16 --lr 1e-3 \
	  --ar-steps 4000 --ar-until-loss 0.25 --ar-margin 600 --ar-mix upper=6,reverse=1.5,kv=1.5,csv=1,count=1.5,letter=1,text=0 \
	  --mix $(MIX_A) --time-limit 4800 --autocast $(AUTOCAST)
	$(VENV)/bin/dllm-deploy train --out $(BROAD)/C --init-from $(BROAD)/B $(BROAD_FLAGS) --seed 3 --batch 8 --lr 3e-4 \
	  --mix count=3,reverse=2,upper=1.2,kv=1.5,csv=0.8,letter=1,text=0.3 --time-limit 1500 --autocast $(AUTOCAST)
	$(VENV)/bin/dllm-deploy train --out $(BROAD)/D --init-from $(BROAD)/C $(BROAD_FLAGS) --seed 4 --batch 16 --lr 4e-4 \
	  --mix upper=0.8,reverse=2,kv=2.5,csv=0.8,count=3,letter=2,text=0.2 --time-limit 4000 --save-every 1500
	$(VENV)/bin/dllm-deploy train --out $(BROAD)/E --init-from $(BROAD)/D $(BROAD_FLAGS) --seed 5 --batch 16 --lr 4e-4 \
	  --mix upper=0.6,reverse=3,kv=1.5,csv=1.2,count=5,letter=1.2,text=0.1 --time-limit 3600 --save-every 1500 --autocast $(AUTOCAST)
	cp $(BROAD)/E/config.json $(BROAD)/E/model.safetensors $(BROAD)/E/training.json $(BROAD)/E/train_log.jsonl $(TINY)/

train-core: $(STAMP)
	$(VENV)/bin/dllm-deploy train --out $(CORE) --seed 0 --steps 8000 --ar-steps 3500 --device $(DEVICE)
	$(MAKE) train-phase2

train-phase2: $(STAMP)
	$(VENV)/bin/dllm-deploy train --out $(CORE) --init-from $(CORE) $(PHASE2_FLAGS) --device $(DEVICE)

phase2-flags:
	@echo $(PHASE2_FLAGS)

# The tri-mode (self-speculative) tiny model of checkpoints/tiny-selfspec: the bundled tiny dLLM
# fine-tuned with the joint autoregressive + block-diffusion loss into the Nemotron-Labs-Diffusion
# layout (docs/training.md, "The self-speculative model"; not part of CI).
SELFSPEC := checkpoints/tiny-selfspec
train-selfspec: $(STAMP)
	$(VENV)/bin/dllm-deploy train-selfspec --out $(SELFSPEC) --steps 1500 --lr 5e-4 --threads 2

# Self-distillation of the bundled model with the best recipe measured on lab/tiny-core
# (docs/research/distill.md: in distribution, cross-entropy only; about 28 minutes on 2 cores, 55 CPU-minutes; not part of CI).
# The student goes to build/tiny-distilled. --force replaces only a checkpoint that distill wrote.
distill: $(STAMP)
	$(VENV)/bin/dllm-deploy distill --model $(TINY) --out build/tiny-distilled --force $(DISTILL_FLAGS)

clean:
	rm -rf build $(VENV)
