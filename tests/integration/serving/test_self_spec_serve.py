"""A self-speculative artifact (the tri-mode tiny model) behind one real `dllm-deploy serve`:
concurrent requests of every strategy, streamed and whole, seeded sampling, budgets and stop
words, and the OpenAI API, each equal to offline generate of the same prompt; the masked
families' strategies are refused naming the model's."""
from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from .conftest import GEN_LENGTH, Server, serving_python
from .test_server import check_equal, post

PROMPTS = ["upper: father paper air war\n", "count: from 7061 by 5, 4 terms\n", "reverse: fact city day table\n",
           "letter: lost name=milo city=paris item=mirror day=sunday\n"]


@pytest.fixture(scope="module")
def served(selfspec_artifact):
    serving_python()
    from dllm_deploy.runtime.api import Runtime
    rt = Runtime.load(artifact=str(selfspec_artifact))
    s = Server(selfspec_artifact, ["--max-batch-size", "4"], openai=True)
    yield s, lambda prompt, rows=None, **decode: rt.generate([prompt], rows, gen_length=GEN_LENGTH, **decode)[0]
    s.stop()


def test_concurrent_requests_of_every_strategy_equal_offline(served):
    s, offline = served
    cases = [(p, st) for p in PROMPTS for st in ("ar", "linear-spec", "tree-spec", "fastdiffuser")]
    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda c: post(f"{s.url}/v2/models/dllm/generate",
                                             {"text_input": c[0], "strategy": c[1]}), cases))
    for (prompt, strategy), (status, out) in zip(cases, results):
        assert status == 200, out
        check_equal(out, offline(prompt, strategy=strategy))
    lossless = {st: [np.atleast_1d(out["token_ids"]).tolist() for (_, s2), (_, out) in zip(cases, results) if s2 == st]
                for st in ("ar", "linear-spec", "tree-spec")}
    assert lossless["ar"] == lossless["linear-spec"] == lossless["tree-spec"]


def test_stream_sampling_budget_and_stop_equal_offline(served):
    from dllm_deploy.runtime.rows import RowOptions
    s, offline = served
    ref = offline(PROMPTS[3], strategy="tree-spec")
    req = urllib.request.Request(f"{s.url}/v2/models/dllm_stream/generate_stream",
                                 data=json.dumps({"text_input": PROMPTS[3], "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [json.loads(line[5:]) for line in r.read().decode().splitlines() if line.startswith("data:")]
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == ref.text
    assert [t for e in events for t in np.atleast_1d(e["token_ids"]).tolist()] == ref.token_ids
    assert events[-1]["finish_reason"] == ref.finish_reason
    stop = ref.text[3:5]
    cases = [({"temperature": 0.8, "seed": 7}, RowOptions(temperature=0.8, seed=7)),
             ({"max_tokens": 5}, RowOptions(max_tokens=5)),
             ({"stop_words": [stop]}, RowOptions(stop=(stop,)))]
    for body, row in cases:
        status, out = post(f"{s.url}/v2/models/dllm_stream/generate", {"text_input": PROMPTS[3], **body})
        assert status == 200, out
        want = offline(PROMPTS[3], [row])
        check_equal(out, want)
        assert out["finish_reason"] == want.finish_reason
    assert out["finish_reason"] == "stop" and out["text_output"] == ref.text[:ref.text.index(stop)]


def test_masked_strategies_and_greedy_only_sampling_are_refused(served):
    s, _ = served
    status, out = post(f"{s.url}/v2/models/dllm/generate", {"text_input": "x", "strategy": "spd"})
    assert status == 400 and "expected one of ar, linear-spec, tree-spec, fastdiffuser" in out["error"]
    status, out = post(f"{s.url}/v2/models/dllm/generate",
                       {"text_input": "x", "strategy": "fastdiffuser", "temperature": 0.5})
    assert status == 400 and "fastdiffuser decodes greedily" in out["error"]


def test_openai_completion_equals_offline(served):
    openai = pytest.importorskip("openai")
    s, offline = served
    client = openai.OpenAI(base_url=s.openai_url, api_key="unused", max_retries=0, timeout=60)
    ref = offline(PROMPTS[0], strategy="linear-spec")
    out = client.completions.create(model="tiny", prompt=PROMPTS[0], extra_body={"strategy": "linear-spec"})
    assert out.choices[0].text == ref.text and out.usage.completion_tokens == len(ref.token_ids)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPTS[0], stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
