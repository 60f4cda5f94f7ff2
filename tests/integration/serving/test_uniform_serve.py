"""A uniform-diffusion artifact (a tiny random DiffusionGemma) behind one real `dllm-deploy serve`:
concurrent seeded requests, a streamed one and the OpenAI API, each equal to offline generate of
the same prompt; options the rule has no use for are refused in one line."""
from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import GEN_LENGTH, Server, serving_python
from .test_server import check_equal, post

PROMPTS = ["hello there", "abc", "the quick brown fox", "xyz 123"]


@pytest.fixture(scope="module")
def served(diffusion_gemma_export):
    serving_python()
    from dllm_deploy.runtime.api import Runtime
    art = diffusion_gemma_export[1]
    rt = Runtime.load(artifact=str(art))
    s = Server(art, ["--max-batch-size", "4", "--steps", "3"], openai=True)
    yield s, lambda prompt, rows=None: rt.generate([prompt], rows, gen_length=GEN_LENGTH, steps=3)[0]
    s.stop()


def test_concurrent_seeded_requests_equal_offline(served):
    from dllm_deploy.runtime.rows import RowOptions
    s, offline = served
    cases = [(p, seed) for p in PROMPTS for seed in (0, 5)]
    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda c: post(f"{s.url}/v2/models/dllm/generate", {"text_input": c[0], "seed": c[1]}),
                              cases))
    for (prompt, seed), (status, out) in zip(cases, results):
        assert status == 200, out
        ref = offline(prompt, [RowOptions(seed=seed)])
        check_equal(out, ref)
        assert out["finish_reason"] == ref.finish_reason


def test_stream_and_openai_equal_offline(served):
    openai = pytest.importorskip("openai")
    s, offline = served
    ref = offline(PROMPTS[2])
    req = urllib.request.Request(f"{s.url}/v2/models/dllm_stream/generate_stream",
                                 data=json.dumps({"text_input": PROMPTS[2], "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [json.loads(line[5:]) for line in r.read().decode().splitlines() if line.startswith("data:")]
    assert "".join(e["text_output"] for e in events) == ref.text and events[-1]["finish_reason"] == ref.finish_reason
    client = openai.OpenAI(base_url=s.openai_url, api_key="unused", max_retries=0, timeout=60)
    out = client.completions.create(model="tiny", prompt=PROMPTS[2])
    assert out.choices[0].text == ref.text and out.usage.completion_tokens == len(ref.token_ids)


def test_sampler_options_and_other_strategies_are_refused(served):
    s, _ = served
    for body, needle in (({"strategy": "spd"}, "expected one of uniform-diffusion"),
                         ({"temperature": 0.7}, "do not apply to a uniform-diffusion model")):
        status, out = post(f"{s.url}/v2/models/dllm/generate", {"text_input": "x", **body})
        assert status == 400 and needle in out["error"], out
