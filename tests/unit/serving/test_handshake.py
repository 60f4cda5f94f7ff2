"""serve's longer wait for PyTriton's instance handshake (dllm_deploy/serving/server.py,
patient_handshakes), on the installed PyTriton's own communication.py."""
from __future__ import annotations

import importlib.util
import inspect
import shutil
from pathlib import Path

import pytest


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"communication_{path.parent.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_models_copy_waits_longer_for_its_config_socket(tmp_path):
    pytest.importorskip("pytriton")
    from pytriton.proxy import communication

    from dllm_deploy.serving.server import HANDSHAKE_WAIT_S, patient_handshakes
    assert inspect.signature(communication.get_config_from_handshake_server).parameters["timeout_s"].default == 1.0
    store = tmp_path / "model-store"
    for model in ("dllm", "dllm_stream"):
        (store / model / "1").mkdir(parents=True)
        shutil.copy(communication.__file__, store / model / "1" / "communication.py")
    (store / "dllm" / "config.pbtxt").write_text("name: 'dllm'\n")
    assert patient_handshakes(store) == 2
    for model in ("dllm", "dllm_stream"):
        waits = inspect.signature(_load(store / model / "1" / "communication.py").get_config_from_handshake_server)
        assert waits.parameters["timeout_s"].default == HANDSHAKE_WAIT_S
    assert patient_handshakes(store) == 0                       # already changed: nothing to do
