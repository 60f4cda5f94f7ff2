# Two commands do all the setup on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test train train-phase2 phase2-flags distill clean cpp

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[export,dev,serve]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dllm-deploy demo

# lint-imports: the module layers of docs/architecture.md ([tool.importlinter] in pyproject.toml)
test: $(STAMP) cpp
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q tests

# The C/C++ embedding (docs/cpp.md): ONNX Runtime headers + library into build/onnxruntime,
# then libdllm_deploy.so, dllm-generate and dllm-embed into build/cpp (the tests add an
# AddressSanitizer build in build/cpp-asan with `cpp/scripts/build.sh asan`); ctest then rebuilds
# every golden plan of tests/cpp/fixtures with cpp/src/canvas.cpp and compares it exactly.
cpp: $(STAMP)
	PYTHON=$(abspath $(PY)) cpp/scripts/build.sh release
	ctest --test-dir build/cpp --output-on-failure

# Retrain the bundled tiny dLLM with the committed recipe (docs/training.md; not part of CI).
# Phase 1: 3500 autoregressive warm-up steps, then 4500 block-diffusion steps, batch 16 (about 86
# minutes on 2 idle CPU cores from measured step times, 5.4 minutes on one H200, where the committed
# phase 1 was trained). Phase 2: 8000 more block-diffusion steps from phase 1's weights, batch 8,
# lr 3e-4, count/reverse weighted up (about 52 minutes on 2 CPU cores, where the committed phase 2
# was trained). DEVICE=cuda trains on a GPU; another device or torch build gives other weights (not
# bit-identical), and on a CPU phase 1's copy circuit forms later: a CPU phase 1 scores lower
# (docs/training.md). `make train-phase2` runs phase 2 alone on the folder's weights;
# tests/gpu/train_candidates.sh reads phase 2's flags from `make -s phase2-flags`.
DEVICE ?= cpu
TINY   := dllm_deploy/models/tiny
PHASE2_FLAGS := --seed 1 --batch 8 --lr 3e-4 --steps 8000 --ar-steps 0 \
                --mix count=3,reverse=2,upper=1.2,kv=1,csv=0.8,letter=0.4,text=0.5
DISTILL_FLAGS := --dist core --entropy-weight 0 --steps 2900 --batch 8 --lr 1e-4 --seed 0 --teacher-prompts 256 --threads 2
train: $(STAMP)
	$(PY) -m dllm_deploy.models.train --out $(TINY) --seed 0 --steps 8000 --ar-steps 3500 --device $(DEVICE)
	$(MAKE) train-phase2

train-phase2: $(STAMP)
	$(PY) -m dllm_deploy.models.train --out $(TINY) --init-from $(TINY) $(PHASE2_FLAGS) --device $(DEVICE)

phase2-flags:
	@echo $(PHASE2_FLAGS)

# Self-distillation of the bundled model with the best recipe measured (docs/distill.md: in
# distribution, cross-entropy only; about 45 CPU-minutes; not part of CI). The student goes to
# build/tiny-distilled: it did not meet the goals for replacing the bundled model. --force
# replaces only a checkpoint that distill wrote.
distill: $(STAMP)
	$(VENV)/bin/dllm-deploy distill --model $(TINY) --out build/tiny-distilled --force $(DISTILL_FLAGS)

clean:
	rm -rf build $(VENV)
