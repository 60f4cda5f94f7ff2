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

# Retrain the bundled tiny dLLM as committed (two phases, about 83 minutes on 2 idle CPU cores;
# not part of CI; docs/model_card.md). Add DEVICE=cuda to train on a GPU.
DEVICE ?= cpu
train: $(STAMP)
	$(PY) -m dllm_deploy.models.train --out dllm_deploy/models/tiny --seed 0 --steps 3600 --stop-after 1900 --suffix-share 0 --device $(DEVICE)
	$(PY) -m dllm_deploy.models.train --out dllm_deploy/models/tiny --init-from dllm_deploy/models/tiny --seed 1 --steps 3800 --suffix-share 0.5 --device $(DEVICE)

clean:
	rm -rf build $(VENV)
