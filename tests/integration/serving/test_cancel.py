"""Work for nobody: a request whose client went away, or whose deadline passed, leaves the queue or
its batch at the next forward (scheduler.py, Runtime.stream(cancel=...)), through the OpenAI
frontend (it cancels on disconnect), Triton's endpoints (``request_id`` + ``cancel``) and deadlines
(``timeout``, ``--request-timeout``)."""
from __future__ import annotations

import json
import socket
import statistics
import threading
import time
import urllib.request

import pytest

from .conftest import Server, serving_python
from .test_server import PROMPTS, post


@pytest.fixture(scope="module")
def one_at_a_time(tiny_artifact):
    """A server that decodes one request at a time: every queued request waits for the ones before."""
    serving_python()
    s = Server(tiny_artifact[0], ["--max-batch-size", "1", "--static-batches", "--max-queue", "64"], openai=True)
    yield s
    s.stop()


def completion_seconds(s, prompt: str) -> float:
    body = json.dumps({"model": "tiny", "prompt": prompt}).encode()
    t0 = time.monotonic()
    req = urllib.request.Request(f"{s.openai_url}/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        r.read()
    return time.monotonic() - t0


def abandon(s, prompt: str, stream: bool) -> None:
    """Send an OpenAI request and close the connection without reading the answer."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "stream": stream}).encode()
    sock = socket.create_connection(("127.0.0.1", s.openai))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(0.05)
    sock.close()


def test_abandoned_requests_free_the_server(one_at_a_time):
    s = one_at_a_time
    idle = statistics.median(completion_seconds(s, PROMPTS[0]) for _ in range(3))
    for i in range(48):                             # 48 abandoned requests: 48 idle answers of work if decoded
        abandon(s, f"{PROMPTS[i % 4]} {i}", stream=i % 2 == 0)
    time.sleep(0.5)                                 # the frontend notices within 0.25 s, the server at its next forward
    live = completion_seconds(s, PROMPTS[0])
    print(f"idle {idle:.3f} s, after 48 abandoned requests {live:.3f} s")
    assert live < 1.5 * idle + 0.25, (live, idle)


def test_a_named_request_is_cancelled_through_triton(one_at_a_time):
    s = one_at_a_time
    results = {}

    def stream(name: str, prompt: str):
        body = {"text_input": prompt, "stream": True, "request_id": name}
        req = urllib.request.Request(f"{s.url}/v2/models/dllm_stream/generate_stream", data=json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                results[name] = [json.loads(x[5:]) for x in r.read().decode().splitlines() if x.startswith("data:")]
        except urllib.error.HTTPError as e:
            results[name] = [{"error": e.read().decode()}]
    threads = [threading.Thread(target=stream, args=(f"r{i}", PROMPTS[i % 4])) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)                                 # r0 decoding, the others queued behind it (batches of 1)
    deadline = time.time() + 5
    while True:      # r3 may not have reached the server yet: a cancel before its arrival finds nothing
        status, out = post(f"{s.url}/v2/models/dllm_stream/generate", {"cancel": "r3"})
        if status == 200 or "r3" in results or time.time() > deadline:
            break
        time.sleep(0.05)
    if status != 200 and "r3" in results and "error" not in results["r3"][-1]:
        for t in threads:
            t.join(timeout=60)
        pytest.skip("r3 was answered before its cancel reached the server: nothing left to cancel on this run")
    assert status == 200 and out["finish_reason"] == "cancelled", out
    for t in threads:
        t.join(timeout=60)
    assert "cancelled" in results["r3"][-1]["error"], results["r3"]
    assert all(results[f"r{i}"][-1].get("finish_reason") for i in range(3)), results
    status, out = post(f"{s.url}/v2/models/dllm_stream/generate", {"cancel": "r3"})      # gone now
    assert status >= 400 and "no request 'r3' in flight" in out["error"]
    status, out = post(f"{s.url}/v2/models/dllm_stream/generate", {"cancel": "r3", "text_input": "x"})
    assert status >= 400 and "a cancel request carries only cancel" in out["error"]


def test_deadlines(one_at_a_time):
    s = one_at_a_time
    status, out = post(f"{s.url}/v2/models/dllm/generate", {"text_input": PROMPTS[0], "timeout": 0.001})
    assert status >= 400 and "timeout: the request's deadline (0.001 s) passed" in out["error"], out
    status, out = post(f"{s.url}/v2/models/dllm/generate", {"text_input": PROMPTS[0], "timeout": -1})
    assert status >= 400 and "timeout: -1.0 is outside" in out["error"], out
    body = json.dumps({"model": "tiny", "prompt": PROMPTS[0], "timeout": 0.001}).encode()
    req = urllib.request.Request(f"{s.openai_url}/completions", data=body, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 504 and json.loads(e.value.read())["error"]["param"] == "timeout"
    status, out = post(f"{s.url}/v2/models/dllm/generate", {"text_input": PROMPTS[0], "timeout": 60})
    assert status == 200, out
