"""Golden plan fixtures for the C++ port (tests/data/golden/, format in its README.md): every
canvas.py plan of a short real decode (tiny random checkpoints, L = 4, two blocks, W = 2, a
two-row batch with one left-padded row) for each attention and cache mode.

test_decode_makes_the_committed_calls re-records them (DLLM_UPDATE_PLAN_FIXTURES=1 rewrites the
files instead); test_fixtures_replay rebuilds each committed plan from its recorded inputs, so a
builder change that the fixtures do not show fails here before the C++ side sees it.
"""
from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import numpy as np
import pytest

from dllm_deploy.runtime import canvas

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "golden"
BUILDERS = ("first_block", "tree_verify", "commit_next", "refresh", "canvas_verify", "held_verify")
CASES = {  # file stem: (layout, cache mode, decode options)
    "block_causal-exact": ("block_causal", "exact", {"strategy": "spd", "beam_width": 2}),
    "block_causal-none": ("block_causal", "none", {"strategy": "spd", "beam_width": 2}),
    "block_causal-delayed": ("block_causal", "delayed", {"strategy": "threshold", "threshold": 0.2}),
    "block_causal-delayed-ragged": ("block_causal", "delayed", {"strategy": "threshold", "threshold": 0.006}),
    "llada-none": ("llada", "none", {"strategy": "vanilla"}),
    "llada-prefix": ("llada", "prefix", {"strategy": "spd", "beam_width": 2}),
    "llada-dual": ("llada", "dual", {"strategy": "spd", "beam_width": 2}),
    "dream-prefix": ("dream", "prefix", {"strategy": "spd", "beam_width": 2}),
    "dream-dual": ("dream", "dual", {"strategy": "spd", "beam_width": 2}),
}
PROMPTS = ["5 6 7", "8 9"]


def _mask_rows(mask: np.ndarray) -> list[list[str]]:
    """(B,1,T,S) bool -> B lists of T strings of S '0'/'1'."""
    return [["".join("1" if x else "0" for x in q) for q in row[0]] for row in mask]


def encode(value):
    """A builder argument or a plan as JSON: arrays as nested lists (bools as 0/1)."""
    if isinstance(value, canvas.Prefix):
        return {k: encode(getattr(value, k)) for k in ("ids", "positions", "valid", "blocks")}
    if isinstance(value, canvas.Plan):
        return {"ids": encode(value.ids), "positions": encode(value.positions), "mask": _mask_rows(value.mask),
                "keep": value.keep, "cache": value.cache, "read": encode(value.read)}
    if isinstance(value, np.ndarray):
        return value.astype(np.int64).tolist()
    return value


def decode_inputs(inputs: dict) -> dict:
    """The builder's keyword arguments from a recorded call's inputs."""
    out = dict(inputs)
    p = inputs["prefix"]
    out["prefix"] = canvas.Prefix(np.array(p["ids"], dtype=np.int64), np.array(p["positions"], dtype=np.int64),
                                  np.array(p["valid"], dtype=bool), np.array(p["blocks"], dtype=np.int64))
    for k in ("block", "nodes", "nxt"):
        if k in out:
            out[k] = np.array(out[k], dtype=np.int64)
    for k in ("held", "fresh"):
        if k in out:
            out[k] = np.array(out[k], dtype=bool).reshape(len(out["block"]), -1)
    return out


class _Tokens:
    """Space-separated ids: the prompts are token ids already."""

    def encode(self, text: str) -> list[int]:
        return [int(x) for x in text.split()]

    def decode(self, ids) -> str:
        return " ".join(map(str, ids))


def record(tmp_path, monkeypatch, layout: str, mode: str, options: dict) -> dict:
    """Decode PROMPTS on a tiny random checkpoint, recording every builder call."""
    from dllm_deploy.runtime.backends.torch import TorchBackend
    from dllm_deploy.runtime.loop import Decoder
    from dllm_deploy.runtime.strategies import DecodeConfig
    from tests.conftest import write_checkpoint

    calls = []
    for name in BUILDERS:
        build = getattr(canvas, name)

        def spy(*args, _build=build, _name=name, **kwargs):
            plan = _build(*args, **kwargs)
            bound = inspect.signature(_build).bind(*args, **kwargs).arguments
            calls.append({"builder": _name, "inputs": {k: encode(v) for k, v in bound.items()}, "plan": encode(plan)})
            return plan
        monkeypatch.setattr(canvas, name, spy)
    be = TorchBackend.load(str(write_checkpoint(tmp_path / layout, layout)), topk=2)
    Decoder(be, _Tokens(), be.config).generate(PROMPTS, DecodeConfig(block_length=4, gen_length=8, cache=mode, **options))
    monkeypatch.undo()
    return {"layout": layout, "cache": mode, "options": options, "prompts": [_Tokens().encode(p) for p in PROMPTS],
            "calls": calls}


def dumps(fixture: dict) -> str:
    """One call per line: small files whose diffs read call by call."""
    head = json.dumps({k: v for k, v in fixture.items() if k != "calls"})[:-1]
    calls = ",\n".join(json.dumps(c, separators=(",", ":")) for c in fixture["calls"])
    return f'{head}, "calls": [\n{calls}\n]}}\n'


@pytest.mark.parametrize("stem", sorted(CASES))
def test_decode_makes_the_committed_calls(tmp_path, monkeypatch, stem):
    fixture = record(tmp_path, monkeypatch, *CASES[stem])
    verify = "held_verify" if "delayed" in stem else "tree_verify" if stem.startswith("block") else "refresh"
    assert {c["builder"] for c in fixture["calls"]} >= {verify}
    path = FIXTURES / f"{stem}.json"
    if os.environ.get("DLLM_UPDATE_PLAN_FIXTURES") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(fixture))
    assert json.loads(path.read_text()) == fixture, f"{path} is stale: rerun with DLLM_UPDATE_PLAN_FIXTURES=1"


@pytest.mark.parametrize("stem", sorted(CASES))
def test_fixtures_replay(stem):
    fixture = json.loads((FIXTURES / f"{stem}.json").read_text())
    assert fixture["calls"]
    for call in fixture["calls"]:
        plan = getattr(canvas, call["builder"])(**decode_inputs(call["inputs"]))
        assert encode(plan) == call["plan"], call["builder"]
