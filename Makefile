# Two commands do all the setup on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test train clean

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[export,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dllm-deploy demo

test: $(STAMP)
	$(PY) -m pytest -q tests

# Retrain the bundled tiny dLLM (about 55 minutes on 2 CPU cores; not part of CI).
train: $(STAMP)
	$(PY) -m dllm_deploy.models.train --out dllm_deploy/models/tiny --seed 0

clean:
	rm -rf build $(VENV)
