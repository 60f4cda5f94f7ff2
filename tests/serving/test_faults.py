"""SIGKILL of `dllm-deploy serve` mid-request: clients get errors at once (no hang), tritonserver
and its stubs go with it (serving/reaper.py), the ports are free again, the workspace and
PyTriton's shared-memory segments are gone."""
from __future__ import annotations

import os
import signal
import socket
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from dllm_deploy.serving.server import _descendants

from .conftest import Server, serving_python
from .test_server import PROMPTS, post


def alive(pid: int) -> bool:
    """A process that still runs (a zombie holds no port and no memory: it counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_sigkill_of_serve_mid_load_leaves_nothing(tiny_artifact):
    serving_python()
    s = Server(tiny_artifact[0], ["--max-batch-size", "2", "--static-batches"])
    tree = _descendants(s.proc.pid)
    workspaces = {a for p in tree for a in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace").split("\0")
                  if a.startswith("/tmp/dllm-serve-")}
    shm = lambda: [n for n in os.listdir("/dev/shm") if n.startswith(f"pytrtion{s.proc.pid}-")]  # noqa: E731
    with ThreadPoolExecutor(16) as ex:
        futures = [ex.submit(post, f"{s.url}/v2/models/dllm/generate", {"text_input": p}, 30) for p in PROMPTS * 4]
        wait(futures, timeout=20, return_when=FIRST_COMPLETED)   # one batch of 2 answered: 14 queued or decoding
        segments = shm()
        os.kill(s.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result(timeout=30))
            except Exception as e:                   # noqa: BLE001 - the connection broke: what a client sees
                outcomes.append(e)
    assert time.monotonic() - killed < 10, "a client hung after the server died"
    assert any(isinstance(o, Exception) for o in outcomes), outcomes
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (any(alive(p) for p in tree)
                                           or not all(port_free(p) for p in (s.http, s.grpc, s.metrics))):
        time.sleep(0.2)
    assert [p for p in tree if alive(p)] == [], "processes of the killed server are still running"
    assert all(port_free(p) for p in (s.http, s.grpc, s.metrics))
    assert workspaces and not any(Path(w.split("/pytriton")[0]).exists() for w in workspaces)
    while time.monotonic() < deadline and shm():
        time.sleep(0.2)
    assert segments and shm() == [], "shared-memory segments of the killed server are left"
    s.proc.wait()
