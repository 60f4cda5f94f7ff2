"""Bidirectional models (LLaDA, Dream) in C++: the canvas [prefix | block | suffix of masks] under
the cache modes none, prefix and dual (runtime/canvas.py: refresh / canvas_verify), token-identical
to the Python ONNX Runtime runtime with the same counters; and the block-causal `none` mode.

Random tiny LLaDA- and Dream-layout checkpoints (tests/conftest.py::write_checkpoint) exported
for real; the bundled tiny model's artifact relabelled bidirectional (its graphs take the mask
as an input, so only the manifest's capabilities change) adds a peaked model, where the
threshold rule commits several tokens at once, SPD accepts deep and EOS ends rows early."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dllm_deploy.models.capabilities import bidirectional
from dllm_deploy.runtime.api import decode_config
from tests.conftest import write_checkpoint

from .conftest import STRATEGIES, first_prompts, generate_many, run_generate

KEYS = ("text", "token_ids", "forwards", "tokens", "accepted_hist", "finished", "beam_width_used",
        "beam_width_requested")

# per layout: (block length, gen length); LLaDA runs 3 blocks of 8, Dream 2 of 32
SHAPES = {"llada": (8, 24), "dream": (32, 64)}


PROMPTS = first_prompts(2)


def _options(mode: str, strategy: str) -> dict:
    o = {"cache": mode, **STRATEGIES[strategy]}
    if mode == "none" and "beam_width" in o:
        o["beam_width"] = 1          # none on a bidirectional model: one branch per forward
    return o


@pytest.fixture(scope="module")
def bidi_artifacts(tmp_path_factory):
    from dllm_deploy.export.exporter import export
    root = tmp_path_factory.mktemp("bidi")
    out = {}
    for layout in SHAPES:
        folder = write_checkpoint(root / f"{layout}-ckpt", layout)
        export(folder, root / layout, max_beam_width=4, log=lambda m: None)
        out[layout] = root / layout
    return out


@pytest.fixture(scope="module")
def tiny_bidi(tiny_artifact, tmp_path_factory):
    """The tiny artifact with a bidirectional model's capabilities in its manifest (symlinks to its files)."""
    good = Path(tiny_artifact[0])
    d = tmp_path_factory.mktemp("tiny-bidi")
    for f in good.iterdir():
        if f.is_file() and f.name != "manifest.json":
            os.symlink(f, d / f.name)
    m = json.loads((good / "manifest.json").read_text())
    m["model"]["attention"] = "bidirectional"
    m["capabilities"] = bidirectional().to_dict()
    (d / "manifest.json").write_text(json.dumps(m))
    return d


_runtimes: dict = {}


def _python(artifact, prompts, options) -> list[dict]:
    from dllm_deploy import Runtime
    rt = _runtimes.get(str(artifact)) or _runtimes.setdefault(str(artifact), Runtime.load(artifact=str(artifact)))
    return [rt.decoder.generate([p], decode_config(**options))[0].to_dict() for p in prompts]


def _check(cpp_build, artifact, prompts, options, tmp_path) -> list[dict]:
    want = _python(artifact, prompts, options)
    got = generate_many(cpp_build, artifact, prompts, options, tmp_path)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert {k: g[k] for k in KEYS} == {k: w[k] for k in KEYS}
        assert g["tpf"] == pytest.approx(w["tpf"])
    return want


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("mode", ["none", "prefix", "dual"])
@pytest.mark.parametrize("layout", list(SHAPES))
def test_canvas_matches_python(layout, mode, strategy, cpp_build, bidi_artifacts, tmp_path):
    L, gen = SHAPES[layout]
    _check(cpp_build, bidi_artifacts[layout], PROMPTS, {"block_length": L, "gen_length": gen, **_options(mode, strategy)},
           tmp_path)


# the peaked model: one prompt, gen 64 (two blocks of 32), the strategies where it matters
PEAKED = [("none", "threshold"), ("prefix", "spd-lossless-threshold"), ("prefix", "spd-select-threshold"),
          ("dual", "spd-lossless-vanilla"), ("dual", "threshold")]


@pytest.mark.parametrize("mode,strategy", PEAKED)
def test_canvas_matches_python_on_a_peaked_model(mode, strategy, cpp_build, tiny_bidi, tmp_path):
    want = _check(cpp_build, tiny_bidi, PROMPTS[:1], {"gen_length": 64, **_options(mode, strategy)}, tmp_path)
    if strategy.startswith("spd-lossless"):
        assert max(int(k) for k in want[0]["accepted_hist"]) > 1    # one verification accepted several steps


def test_block_causal_none_matches_python(cpp_build, tiny_artifact, tmp_path):
    """Block-causal, cache none: the prefix recomputed in every forward (verify graph, W 4)."""
    _check(cpp_build, tiny_artifact[0], PROMPTS[:1], {"gen_length": 64, "cache": "none", "strategy": "spd",
                                                      "base": "threshold", "beam_width": 4}, tmp_path)


def test_dual_on_block_causal_is_exact(cpp_build, tiny_artifact, tmp_path):
    """prefix and dual resolve to exact for a block-causal model: the same output as exact."""
    opts = {"gen_length": 64, "strategy": "spd", "beam_width": 4}
    rows = [generate_many(cpp_build, tiny_artifact[0], PROMPTS[:1], {**opts, "cache": c}, tmp_path)[0]
            for c in ("exact", "dual")]
    assert {k: rows[0][k] for k in KEYS} == {k: rows[1][k] for k in KEYS}


def test_new_cache_modes_under_address_sanitizer(cpp_asan_build, cpp_build, bidi_artifacts, tiny_artifact):
    """Each cache mode of the canvas once under ASan (SPD W 2 where the mode allows it), and
    block-causal none (short blocks, so its recomputed prefix grows over several commits)."""
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99"}
    runs = [(bidi_artifacts["dream"], mode, "1" if mode == "none" else "2") for mode in ("none", "prefix", "dual")]
    runs.append((tiny_artifact[0], "none", "2"))
    for artifact, mode, width in runs:
        args = ["--artifact", str(artifact), "--prompt", PROMPTS[0], "--json", "--gen-length", "20",
                "--block-length", "8", "--cache", mode, "--strategy", "spd", "--beam-width", width]
        asan = run_generate(cpp_asan_build, *args, env=env)
        assert asan.returncode == 0 and "Sanitizer" not in asan.stderr, asan.stderr[-3000:]
        plain = run_generate(cpp_build, *args)
        keys = ("token_ids", "forwards", "accepted_hist")
        assert {k: json.loads(asan.stdout)[k] for k in keys} == {k: json.loads(plain.stdout)[k] for k in keys}
