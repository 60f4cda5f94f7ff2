"""`dllm-deploy triton-repo` under the tritonserver binary the nvidia-pytriton wheel bundles
(started by hand, as a stock tritonserver is): the same client checks as against `serve`."""
from __future__ import annotations

import json
import os
import signal
import sys
import sysconfig
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dllm_deploy.cli import main

from .conftest import GEN_LENGTH, ROOT, Server, serving_python
from .test_server import PROMPTS, check_equal, post


def stock_tritonserver(repo: Path, scratch: Path):
    """The command and environment of the bundled tritonserver over ``repo``: a backend folder
    with the Python backend and the stub for this Python, the wheel's libraries and this
    interpreter's LIBDIR on LD_LIBRARY_PATH, this venv first on PATH (the stub finds its
    site-packages through it) and this checkout on PYTHONPATH."""
    import pytriton
    from pytriton.utils.distribution import get_libs_path
    base = Path(pytriton.__file__).parent / "tritonserver"
    backend = scratch / "backends" / "python"
    backend.mkdir(parents=True)
    for f in (base / "backends" / "python").iterdir():
        (backend / f.name).symlink_to(f)
    stub = base / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / "triton_python_backend_stub"
    (backend / stub.name).symlink_to(stub)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "LD_LIBRARY_PATH": ":".join([sysconfig.get_config_var("LIBDIR"), str(get_libs_path()),
                                        os.environ.get("LD_LIBRARY_PATH", "")])}

    def command(http, grpc, metrics):
        return [str(base / "bin" / "tritonserver"), "--model-repository", str(repo),
                "--backend-directory", str(scratch / "backends"), "--http-address", "127.0.0.1",
                "--http-port", str(http), "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
                "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics), "--exit-timeout-secs", "3"]
    return command, env


@pytest.fixture(scope="module")
def stock(tiny_artifact, tmp_path_factory):
    serving_python()
    scratch = tmp_path_factory.mktemp("stock")
    repo = scratch / "repo"
    assert main(["triton-repo", "--artifact", str(tiny_artifact[0]), "--gen-length", str(GEN_LENGTH),
                 "--max-batch-size", "4", "--out", str(repo)]) == 0
    command, env = stock_tritonserver(repo, scratch)
    s = Server(tiny_artifact[0], command=command, env=env)
    yield s
    s.proc.send_signal(signal.SIGINT)
    s.stop()


def test_repo_layout_and_refusals(tiny_artifact, tmp_path, capsys):
    repo = tmp_path / "repo"
    args = ["triton-repo", "--artifact", str(tiny_artifact[0]), "--out", str(repo)]
    assert main(args) == 0
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == [
        ".dllm-deploy-triton-repo", "dllm/1/model.py", "dllm/config.pbtxt", "dllm_stream/1/model.py",
        "dllm_stream/config.pbtxt"]
    assert "model_transaction_policy { decoupled: true }" in (repo / "dllm_stream" / "config.pbtxt").read_text()
    assert "dynamic_batching { }" in (repo / "dllm" / "config.pbtxt").read_text()
    assert main(args) == 2 and "--force replaces it" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["triton-repo", "--artifact", str(tiny_artifact[0]), "--out", str(mine), "--force"]) == 2
    assert "did not write" in capsys.readouterr().err and (mine / "notes.txt").read_text() == "keep"
    assert not (tmp_path / ".mine.lock").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and "tmp" in p.name] == []


@pytest.mark.parametrize("model", ["dllm", "dllm_stream"])
def test_stock_generate_equals_offline(stock, offline, model):
    for prompt, strategy in [(PROMPTS[0], "vanilla"), (PROMPTS[1], "spd")]:
        status, out = post(f"{stock.url}/v2/models/{model}/generate", {"text_input": prompt, "strategy": strategy})
        assert status == 200, out
        check_equal(out, offline(prompt, strategy=strategy))


def test_stock_stream_sampling_and_bad_request(stock, offline):
    from dllm_deploy.runtime.rows import RowOptions
    body = {"text_input": PROMPTS[0], "stream": True, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    req = urllib.request.Request(f"{stock.url}/v2/models/dllm_stream/generate_stream", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [json.loads(line[5:]) for line in r.read().decode().splitlines() if line.startswith("data:")]
    ref = offline(PROMPTS[0], rows=[RowOptions(temperature=0.8, top_p=0.9, seed=7)])
    assert "".join(e["text_output"] for e in events) == ref.text and events[-1]["finish_reason"] == ref.finish_reason
    status, out = post(f"{stock.url}/v2/models/dllm/generate", {"text_input": "hi", "strategy": "nope"})
    assert status >= 400 and "unknown strategy 'nope'" in out["error"]
    status, out = post(f"{stock.url}/v2/models/dllm_stream/generate", {"text_input": "hi", "max_token": 3})
    assert status >= 400 and "max_token: unknown field" in out["error"]
    status, out = post(f"{stock.url}/v2/models/dllm/generate", {"messages": json.dumps([{"role": "user", "content": "upper: dog"}])})
    assert status == 200 and out["text_output"] == offline(
        "upper: dog\n").text, out                    # the bundled template: the user message, one line


def test_stock_concurrent_requests_equal_offline(stock, offline):
    prompts = [f"{p} {i}" for i in range(2) for p in PROMPTS]
    with ThreadPoolExecutor(len(prompts)) as ex:
        results = list(ex.map(lambda p: post(f"{stock.url}/v2/models/dllm/generate", {"text_input": p}), prompts))
    for p, (status, out) in zip(prompts, results):
        assert status == 200, out
        check_equal(out, offline(p))
