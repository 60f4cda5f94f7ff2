# Two commands do all the setup on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test train clean cpp

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[export,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dllm-deploy demo

test: $(STAMP) cpp
	$(PY) -m pytest -q tests

# The C/C++ embedding (docs/cpp.md): ONNX Runtime headers + library into build/onnxruntime,
# then libdllm_deploy.so, dllm-generate and dllm-embed into build/cpp (the tests add an
# AddressSanitizer build in build/cpp-asan with `cpp/scripts/build.sh asan`).
cpp: $(STAMP)
	PYTHON=$(abspath $(PY)) cpp/scripts/build.sh release

# Retrain the bundled tiny dLLM with the committed recipe: 3500 autoregressive warm-up steps, then
# 4500 block-diffusion steps (about 86 minutes on 2 idle CPU cores from measured step times, 5.4
# minutes on one H200, where the committed weights were trained; not part of CI; docs/model_card.md).
# DEVICE=cuda trains on a GPU; another device or torch build gives other weights (not bit-identical),
# and on a CPU the warm-up's copy circuit forms later: a CPU run scores lower (model card, fifth session).
DEVICE ?= cpu
train: $(STAMP)
	$(PY) -m dllm_deploy.models.train --out dllm_deploy/models/tiny --seed 0 --steps 8000 --ar-steps 3500 --device $(DEVICE)

clean:
	rm -rf build $(VENV)
