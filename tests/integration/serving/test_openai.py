"""The OpenAI API (serve --openai-port, serving/openai_api.py) driven by the official ``openai``
client against one real server: every answer equals offline generate of the same prompt (a chat's
prompt rendered by the artifact's template), and every refusal arrives as the client's own
exception type with the field named."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from .conftest import ROOT, free_ports

openai = pytest.importorskip("openai")

CHAT = [{"role": "user", "content": "upper: dog"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60)


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").owned_by == "dllm-deploy"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4")


def test_completion_equals_offline(client, offline, offline_runtime):
    prompt = "count: 1 2 3"
    ref = offline(prompt)
    out = client.completions.create(model="tiny", prompt=prompt)
    assert out.choices[0].text == ref.text
    assert out.choices[0].finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert out.usage.completion_tokens == len(ref.token_ids)
    assert out.usage.prompt_tokens == len(offline_runtime.tokenizer.encode(prompt))
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.usage.model_extra["forwards"] == ref.forwards


def test_streamed_completion_with_usage(client, offline):
    prompt = "reverse: abc"
    ref = offline(prompt, strategy="spd")
    chunks = list(client.completions.create(model="tiny", prompt=prompt, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"strategy": "spd"}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1 and chunks[-2].choices[0].finish_reason == finishes[0]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_equals_offline_of_the_rendered_prompt(client, offline, offline_runtime):
    ref = offline(offline_runtime.chat_prompt(CHAT))
    assert ref.text.strip() == "DOG"                       # the bundled template maps the chat onto the task
    out = client.chat.completions.create(model="tiny", messages=CHAT)
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == ref.text
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_max_tokens_and_seeded_sampling_equal_offline(client, offline):
    from dllm_deploy.runtime.rows import RowOptions
    prompt = "count: 1 2 3"
    cases = [({"stop": ["3"]}, RowOptions(stop=("3",))),
             ({"max_tokens": 5}, RowOptions(max_tokens=5)),
             ({"temperature": 0.8, "top_p": 0.9, "seed": 7}, RowOptions(temperature=0.8, top_p=0.9, seed=7))]
    for kw, row in cases:
        ref = offline(prompt, rows=[row])
        outs = [client.completions.create(model="tiny", prompt=prompt, **kw).choices[0] for _ in range(2)]
        assert [o.text for o in outs] == [ref.text, ref.text], kw
        assert outs[0].finish_reason == {"eos": "stop"}.get(ref.finish_reason, ref.finish_reason), kw


@pytest.mark.parametrize("kw, param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 4096}, "max_tokens"),
    ({"max_tokens": 2**32 + 2}, "max_tokens"),
    ({"n": 2}, "n"),
    ({"logprobs": 2}, "logprobs"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"extra_body": {"max_token": 3}}, "max_token"),
    ({"extra_body": {"strategy": "nope"}}, "strategy"),
    ({"extra_body": {"beam_width": 99, "strategy": "spd"}}, "beam_width"),
    ({"extra_body": {"temperature": "hot"}}, "temperature"),
])
def test_bad_requests_are_400_naming_the_field(client, kw, param):
    kw = {"model": "tiny", "prompt": "hi", **kw}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(stream=stream, **kw)
        assert e.value.body["param"] == param, e.value.body
        assert "Traceback" not in e.value.body["message"]


def test_chat_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=CHAT)
    with pytest.raises(openai.BadRequestError) as e:        # the template's own refusal
        client.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "be nice"}])
    assert e.value.body["param"] == "messages" and "refused" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[])
    assert e.value.body["param"] == "messages"


@pytest.mark.parametrize("body", ["{bad", "[1]", "", json.dumps({"model": "tiny"})])
def test_malformed_bodies(server, body):
    req = urllib.request.Request(f"{server.openai_url}/completions", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400
    assert set(json.loads(e.value.read())["error"]) == {"message", "type", "param", "code"}


def test_server_refusals_map_to_statuses():
    from dllm_deploy.serving.contract import BadRequest
    from dllm_deploy.serving.openai_api import server_error
    cases = [("server busy: 64 requests already queued or decoding (--max-queue)", 429, None),
             ("the server is shutting down", 503, None),
             ("text_input: empty prompt", 400, "messages"),
             ("stop_words: an empty stop word", 400, "stop"),
             ("decode failed: boom", 500, None)]
    for message, status, param in cases:
        e = server_error(f"{BadRequest.__module__}.BadRequest: {message}\n", "messages")
        assert (e.status, e.param) == (status, param), message
    assert openai.RateLimitError.__name__ and server_error("server busy: x", "prompt").type == "rate_limit_error"


def test_frontend_alone_reports_an_unreachable_server():
    """`dllm-deploy openai` over a gRPC port nobody listens on: health 503, requests 503."""
    port, dead = free_ports(2)
    proc = subprocess.Popen([sys.executable, "-m", "dllm_deploy.cli", "openai", "--triton-url", f"127.0.0.1:{dead}",
                             "--port", str(port), "--served-model-name", "m"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        from .conftest import wait_ready
        with pytest.raises(RuntimeError):       # ready never: /health is 503 while Triton is unreachable
            wait_ready(f"http://127.0.0.1:{port}", proc, timeout=6, paths=["/health"])
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)
        assert [m.id for m in c.models.list().data] == ["m"]
        with pytest.raises(openai.InternalServerError) as e:
            c.completions.create(model="m", prompt="hi")
        assert e.value.status_code == 503 and "unreachable" in e.value.message
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "OpenAI API for model m" in proc.stderr.read()

