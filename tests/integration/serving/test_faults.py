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


def test_sigterm_under_load_drains_every_answer(tiny_artifact, offline):
    """SIGTERM with requests queued and decoding (plain and streamed, through Triton and the OpenAI
    frontend): none is lost, each equals offline generate, new requests are refused meanwhile, and
    serve exits 0 with its two lines and no traceback."""
    import json
    import urllib.request

    serving_python()
    s = Server(tiny_artifact[0], ["--max-batch-size", "2", "--static-batches", "--drain-timeout", "60"], openai=True)

    def sse(prompt):
        req = urllib.request.Request(f"{s.url}/v2/models/dllm_stream/generate_stream",
                                     data=json.dumps({"text_input": prompt, "stream": True}).encode())
        with urllib.request.urlopen(req, timeout=60) as r:
            events = [json.loads(line[5:]) for line in r.read().decode().splitlines() if line.startswith("data:")]
        assert events[-1]["finish_reason"], events
        return "".join(e["text_output"] for e in events)

    def plain(prompt):
        status, out = post(f"{s.url}/v2/models/dllm/generate", {"text_input": prompt}, 60)
        assert status == 200, out
        return out["text_output"]

    def chat(prompt):
        body = {"model": "tiny", "prompt": prompt}
        req = urllib.request.Request(f"{s.openai_url}/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["choices"][0]["text"]
    calls = [(p, lambda p=p: plain(p))
             for p in PROMPTS] + [(p, lambda p=p: sse(p)) for p in PROMPTS] + [(p, lambda p=p: chat(p)) for p in PROMPTS]
    with ThreadPoolExecutor(len(calls)) as ex:
        futures = [ex.submit(fn) for _, fn in calls]
        wait(futures, timeout=30, return_when=FIRST_COMPLETED)          # decoding has begun; most still queued
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30     # refusals start with the drain, which serve logs first (on
        while "draining" not in s.stderr() and time.monotonic() < deadline:   # a loaded machine that took
            time.sleep(0.05)                                                  # over the 0.3 s once waited)
        time.sleep(0.3)
        status, out = post(f"{s.url}/v2/models/dllm/generate", {"text_input": "hello"}, 30)
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result(timeout=90))
            except (AssertionError, OSError) as e:      # a client that had not reached the server yet
                outcomes.append(e)
    assert status != 200 and "shutting down" in out["error"], (status, out)
    answered = [(o, offline(p).text) for o, (p, _) in zip(outcomes, calls) if isinstance(o, str)]
    refused = [o for o in outcomes if not isinstance(o, str)]
    # every request the server took is answered in full; one whose client had not yet connected
    # when the signal came (thread start-up on a loaded machine) is refused, never half-answered
    assert [a for a, _ in answered] == [b for _, b in answered]
    assert len(answered) >= len(calls) // 2, outcomes
    assert all("shutting down" in str(e) or "Connection refused" in str(e) for e in refused), refused
    assert s.proc.wait(timeout=90) == 0
    err = s.stderr()
    assert "dllm-deploy: SIGTERM: draining" in err and "in-flight requests answered" in err, err[-2000:]
    assert "Traceback" not in err, err[-3000:]


def test_a_drain_past_its_timeout_ends_every_answer(tiny_artifact):
    """--drain-timeout 0: what is in flight when the signal comes ends with an error or its
    answer, never with nothing; serve still exits 0."""
    import json
    import urllib.error
    import urllib.request

    serving_python()
    s = Server(tiny_artifact[0], ["--max-batch-size", "1", "--static-batches", "--drain-timeout", "0"])

    def sse(prompt):
        req = urllib.request.Request(f"{s.url}/v2/models/dllm_stream/generate_stream",
                                     data=json.dumps({"text_input": prompt, "stream": True}).encode())
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                events = [json.loads(line[5:]) for line in r.read().decode().splitlines() if line.startswith("data:")]
        except urllib.error.HTTPError as e:
            return [{"error": f"{e.code} {e.read()!r}"}]
        return events
    with ThreadPoolExecutor(8) as ex:
        futures = [ex.submit(sse, p) for p in PROMPTS * 2]
        wait(futures, timeout=30, return_when=FIRST_COMPLETED)
        s.proc.send_signal(signal.SIGTERM)
        streams = [f.result(timeout=60) for f in futures]
    for events in streams:
        assert events and ("error" in events[-1] or events[-1].get("finish_reason")), events
    assert any("error" in e[-1] for e in streams), streams
    assert s.proc.wait(timeout=60) == 0
    err = s.stderr()
    assert "ended by the drain timeout" in err and "Traceback" not in err, err[-2000:]


def test_the_artifact_changed_in_place_under_a_running_server(tiny_artifact, tmp_path, offline):
    """weights.bin overwritten in place (same size, other bytes), then truncated: each request gets
    a clear error, never an answer from weights that are not the model's, and no SIGBUS."""
    import shutil
    serving_python()
    art = tmp_path / "tiny"
    shutil.copytree(tiny_artifact[0], art)
    s = Server(art, ["--max-batch-size", "2"])
    try:
        status, out = post(f"{s.url}/v2/models/dllm/generate", {"text_input": PROMPTS[0]})
        assert status == 200 and out["text_output"] == offline(PROMPTS[0]).text
        weights = art / "weights.bin"
        size = weights.stat().st_size
        with open(weights, "r+b") as f:                 # in place: the inode the server mapped
            f.write(bytes(reversed(weights.read_bytes()[:4096])))
        status, out = post(f"{s.url}/v2/models/dllm/generate", {"text_input": PROMPTS[0]})
        assert status >= 400 and "weights.bin changed on disk after it was loaded" in out["error"], out
        os.truncate(weights, size // 2)
        for model in ("dllm", "dllm_stream"):
            status, out = post(f"{s.url}/v2/models/{model}/generate", {"text_input": PROMPTS[1]})
            assert status >= 400 and f"({size} -> {size // 2} bytes)" in out["error"], out
        assert s.proc.poll() is None                    # still up, still answering with the reason
    finally:
        assert s.stop() == 0
