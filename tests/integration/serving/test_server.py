"""Client checks against one real `dllm-deploy serve` (conftest.server): every response equals
offline generate of the same prompt; bad requests fail alone; concurrent requests batch."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from .conftest import ROOT

PROMPTS = ["count: 1 2 3", "hello", "reverse: abc", "upper: dog"]


def post(url: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def check_equal(out: dict, ref) -> None:
    assert out["text_output"] == ref.text
    assert np.atleast_1d(out["token_ids"]).tolist() == list(ref.token_ids)
    assert int(np.asarray(out["forwards"]).reshape(-1)[0]) == ref.forwards


@pytest.mark.parametrize("model", ["dllm", "dllm_stream"])
def test_http_generate_equals_offline(server, offline, model):
    for prompt, strategy in [(PROMPTS[0], "vanilla"), (PROMPTS[1], "spd")]:
        status, out = post(f"{server.url}/v2/models/{model}/generate", {"text_input": prompt, "strategy": strategy})
        assert status == 200, out
        check_equal(out, offline(prompt, strategy=strategy))
        assert out["finish_reason"] in ("eos", "length")


def test_seeded_sampling_max_tokens_and_stop_equal_offline(server, offline):
    from dllm_deploy.runtime.rows import RowOptions
    cases = [({"temperature": 0.8, "top_p": 0.9, "seed": 7}, RowOptions(temperature=0.8, top_p=0.9, seed=7)),
             ({"max_tokens": 5}, RowOptions(max_tokens=5)),
             ({"stop_words": ["3"]}, RowOptions(stop=("3",)))]
    for body, row in cases:
        status, out = post(f"{server.url}/v2/models/dllm_stream/generate", {"text_input": PROMPTS[0], **body})
        assert status == 200, out
        ref = offline(PROMPTS[0], rows=[row])
        check_equal(out, ref)
        assert out["finish_reason"] == ref.finish_reason


def test_kserve_infer_http_and_grpc(server, offline):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    ref = offline(PROMPTS[2])
    for mod, url in [(httpclient, f"127.0.0.1:{server.http}"), (grpcclient, f"127.0.0.1:{server.grpc}")]:
        client = mod.InferenceServerClient(url)
        x = mod.InferInput("text_input", [1], "BYTES")
        x.set_data_from_numpy(np.array([PROMPTS[2].encode()], dtype=object))
        res = client.infer("dllm", [x], client_timeout=60) if mod is grpcclient else client.infer("dllm", [x])
        out = {"text_output": res.as_numpy("text_output")[0].decode(), "token_ids": res.as_numpy("token_ids"),
               "forwards": res.as_numpy("forwards")}
        check_equal(out, ref)


def test_generate_stream_sse(server, offline):
    req = urllib.request.Request(f"{server.url}/v2/models/dllm_stream/generate_stream",
                                 data=json.dumps({"text_input": PROMPTS[0], "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [json.loads(line[5:]) for line in r.read().decode().splitlines() if line.startswith("data:")]
    assert events and all("error" not in e for e in events), events
    ref = offline(PROMPTS[0])
    assert "".join(e["text_output"] for e in events) == ref.text
    assert [t for e in events for t in np.atleast_1d(e["token_ids"]).tolist()] == list(ref.token_ids)
    assert events[-1]["finish_reason"] in ("eos", "length", "stop")


@pytest.mark.parametrize("body, needle", [
    ({"text_input": ""}, "empty prompt"),
    ({"text_input": "x" * 600}, "over the server's limit"),
    ({"text_input": "hi", "max_tokens": 0}, "max_tokens: 0 is outside"),
    ({"text_input": "hi", "max_tokens": 4096}, "max_tokens: 4096 is outside"),
    ({"text_input": "hi", "strategy": "nope"}, "unknown strategy 'nope'"),
    ({"text_input": "hi", "strategy": "spd", "beam_width": 99}, "beam_width: 99 is outside"),
    ({"text_input": "hi", "max_tokens": "many"}, "Unable to parse"),
    ({"text_input": "hi", "stream": True}, "stream from model dllm_stream"),
    ({"text_input": "hi", "temperature": 1.0, "top_k": 1000}, "sampling pool"),
    ({"text_input": "hi", "max_token": 3}, "max_token: unknown field"),
])
def test_bad_request_fails_alone(server, offline, body, needle):
    status, out = post(f"{server.url}/v2/models/dllm/generate", body)
    assert status >= 400 and needle in out["error"], out
    assert "Traceback (most recent call last):\\n  File \"/work" not in out["error"]
    status, out = post(f"{server.url}/v2/models/dllm/generate", {"text_input": PROMPTS[3]})   # still serving
    assert status == 200
    check_equal(out, offline(PROMPTS[3]))


def test_concurrent_requests_batch_and_equal_offline(server, offline):
    prompts = [f"{p} {i}" for i in range(3) for p in PROMPTS]
    with ThreadPoolExecutor(len(prompts)) as ex:
        results = list(ex.map(lambda p: post(f"{server.url}/v2/models/dllm_stream/generate", {"text_input": p}),
                              prompts))
    for p, (status, out) in zip(prompts, results):
        assert status == 200, out
        check_equal(out, offline(p))


def test_busy_port_is_named(tiny_artifact, server):
    from .conftest import serving_python
    r = subprocess.run([serving_python(), "-m", "dllm_deploy.cli", "serve", "--artifact", str(tiny_artifact[0]),
                        "--http-port", str(server.http), "--grpc-port", "1", "--metrics-port", "2"],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"dllm-deploy: error: --http-port {server.http}: 127.0.0.1:{server.http} is busy "
                                "(Address already in use); pick a free port")


def test_a_canvas_that_leaves_no_room_for_a_prompt_is_refused_before_starting(tiny_artifact):
    """--gen-length at the model's max_seq: every request would be refused, so the server never starts."""
    import socket
    from .conftest import serving_python
    socks = [socket.socket() for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [str(s.getsockname()[1]) for s in socks]
    for s in socks:
        s.close()
    r = subprocess.run([serving_python(), "-m", "dllm_deploy.cli", "serve", "--artifact", str(tiny_artifact[0]),
                        "--gen-length", "512", "--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2]],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == ("dllm-deploy: error: a canvas of 512 tokens (--gen-length 512) leaves no room for a "
                                "prompt in the model's 512 positions: pass a smaller --gen-length")


def test_a_mixture_of_experts_artifact_serves_what_it_generates_offline(tmp_path):
    """An LLaDA 2.x artifact (routed experts as com.microsoft.MoE) behind `serve`: concurrent plain
    and SPD requests answer what offline generate gives."""
    from dllm_deploy.export.exporter import export
    from dllm_deploy.runtime.api import Runtime
    from tests.conftest import MOE_CONFIGS, write_random_checkpoint

    from .conftest import GEN_LENGTH, Server, serving_python
    serving_python()
    art = tmp_path / "art"
    export(write_random_checkpoint(tmp_path / "ckpt", MOE_CONFIGS["llada2"]), art, max_beam_width=4, log=lambda m: None)
    rt = Runtime.load(artifact=str(art))
    s = Server(art, ["--max-batch-size", "4"])
    try:
        cases = [(p, st) for p in PROMPTS for st in ("threshold", "spd")]
        with ThreadPoolExecutor(len(cases)) as ex:
            results = list(ex.map(lambda c: post(f"{s.url}/v2/models/dllm/generate",
                                                 {"text_input": c[0], "strategy": c[1]}), cases))
        for (prompt, strategy), (status, out) in zip(cases, results):
            assert status == 200, out
            check_equal(out, rt.generate([prompt], gen_length=GEN_LENGTH, strategy=strategy)[0])
    finally:
        s.stop()


def test_ready_means_every_model_answers(tiny_artifact, offline):
    """The instant GET /v2/health/ready (the documented readiness probe) first answers 200, both
    models answer a request correctly; the 'serving' line comes no earlier."""
    import tempfile
    import time

    from .conftest import GEN_LENGTH, free_ports, serving_python
    http, grpc, metrics = free_ports(3)
    log = tempfile.TemporaryFile("w+")        # serve's stderr, readable while it runs

    def err() -> str:
        log.seek(0)
        return log.read()
    proc = subprocess.Popen([serving_python(), "-m", "dllm_deploy.cli", "serve", "--artifact", str(tiny_artifact[0]),
                             "--gen-length", str(GEN_LENGTH), "--http-port", str(http), "--grpc-port", str(grpc),
                             "--metrics-port", str(metrics)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=log, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{http}"
    try:
        # a start that serve retries (it says why on stderr) takes two starts' time on a loaded machine
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, err()[-2000:]
            try:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.02)
        else:
            pytest.fail(f"never ready: {err()[-2000:]}")
        for model in ("dllm", "dllm_stream"):
            status, out = post(f"{url}/v2/models/{model}/generate", {"text_input": PROMPTS[0]})
            assert status == 200, out
            check_equal(out, offline(PROMPTS[0]))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)       # nothing of it left for the tests after this one
            proc.wait()
            pytest.fail(f"serve did not stop within 120 s of SIGTERM: {err()[-2000:]}")
    assert "dllm-deploy: serving models dllm and dllm_stream" in err()


@pytest.mark.parametrize("flags, message", [
    (["--http-port", "70000"], "--http-port 70000: a port is a number in 1..65535"),
    (["--http-port", "-1"], "--http-port -1: a port is a number in 1..65535"),
    (["--http-port", "0"], "--http-port 0: a port is a number in 1..65535"),
    (["--http-port", "{p}", "--grpc-port", "{p}"], "--grpc-port {p}: --http-port uses that port already; each needs its own"),
    (["--host", "no.such.host.invalid"], "--host no.such.host.invalid: not an address of this machine"),
    (["--http-port", "{p}", "--openai-port", "{p}"], "--openai-port {p}: --http-port uses that port already; each needs its own"),
    (["--chat-template", "/no/such/template.jinja"], "/no/such/template.jinja: cannot read the chat template"),
    (["--chat-template", "{bad}"], "the chat template does not parse (line 1"),
])
def test_flag_mistakes_are_one_line_before_anything_starts(tiny_artifact, tmp_path, flags, message):
    from .conftest import free_ports, serving_python
    p = str(free_ports(1)[0])
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    r = subprocess.run([serving_python(), "-m", "dllm_deploy.cli", "serve", "--artifact", str(tiny_artifact[0]),
                        *[f.format(p=p, bad=bad) for f in flags]], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith(f"dllm-deploy: error: {message.format(p=p)}") and r.stderr.count("\n") == 1


def test_stop_words_are_limited_in_count_and_length(tiny_artifact):
    """Every stop word is searched in every chunk of the row: a request may not slow its batch-mates
    with thousands of them (serving/contract.py Limits)."""
    from dllm_deploy.models.tokenizer import ByteTokenizer
    from dllm_deploy.serving.contract import BadRequest, Limits, parse_request
    limits = Limits(max_prompt_tokens=100, max_tokens=32, max_beam_width=4, max_queue=8)
    base = {"text_input": np.array([b"hello"], dtype=object)}
    ok = parse_request({**base, "stop_words": np.array([b"a"] * 16, dtype=object)}, ByteTokenizer(), limits, {})
    assert ok.row.stop == ("a",) * 16
    with pytest.raises(BadRequest, match="stop_words: 100000 stop words, over the server's limit of 16"):
        parse_request({**base, "stop_words": np.array([b"a"] * 100000, dtype=object)}, ByteTokenizer(), limits, {})
    with pytest.raises(BadRequest, match="stop_words: a stop word of 300 bytes, over the server's limit of 256"):
        parse_request({**base, "stop_words": np.array([b"x" * 300], dtype=object)}, ByteTokenizer(), limits, {})


def test_chat_messages_input_and_prompt_tokens(server, offline, offline_runtime):
    """``messages`` (JSON chat) is rendered by the server with the artifact's template; the response
    counts the prompt's tokens; exactly one of text_input / messages."""
    chat = [{"role": "user", "content": "upper: dog"}]
    ref = offline(offline_runtime.chat_prompt(chat))
    status, out = post(f"{server.url}/v2/models/dllm/generate", {"messages": json.dumps(chat)})
    assert status == 200, out
    check_equal(out, ref)
    assert int(np.asarray(out["prompt_tokens"]).reshape(-1)[0]) == len(offline_runtime.tokenizer.encode(
        offline_runtime.chat_prompt(chat)))
    for body, needle in [({}, "exactly one of the two"),
                         ({"text_input": "hi", "messages": json.dumps(chat)}, "exactly one of the two"),
                         ({"messages": "[{"}, "messages: not JSON"),
                         ({"messages": json.dumps([{"role": "system", "content": "x"}])}, "messages: the chat template refused")]:
        status, out = post(f"{server.url}/v2/models/dllm/generate", body)
        assert status >= 400 and needle in out["error"], (body, out)


def test_a_start_that_loses_tritonserver_fails_at_once():
    """PyTriton's run() waits up to 120 s for a server that already exited (a model failed to load):
    serve's watch ends the wait as soon as the process is gone, so the retry starts at once."""
    import time as _time

    from dllm_deploy.serving.server import StartFailed, _run_watched

    class Exited:                       # tritonserver as PyTriton sees it after it exited
        _tritonserver_running_cmd = object()

        def is_alive(self):
            return False

    class Waiting:                      # Triton.run() blocked in wait_for_server_ready
        _triton_server = Exited()

        def run(self):
            _time.sleep(30)
    t0 = _time.monotonic()
    with pytest.raises(StartFailed):
        _run_watched(Waiting())
    assert _time.monotonic() - t0 < 5
