"""Mixture-of-experts artifacts decode like the dense ones: every strategy gives the same tokens
and forward counts in torch, ONNX Runtime (each expert form) and C++; lossless SPD gives its base
rule's tokens; the exact and delayed caches of the block-causal families run. One export per
family and form for the module (random checkpoints of tests/conftest.py MOE_CONFIGS)."""
from __future__ import annotations

import json

import pytest

from dllm_deploy.runtime.api import decode_config
from tests.conftest import MOE_CONFIGS, STRATEGIES, write_random_checkpoint

from .conftest import generate_many

KEYS = ("text", "token_ids", "forwards", "tokens", "accepted_hist", "finished")
PROMPTS = ["hello", "a longer prompt, 2+3="]
FORMS = ("contrib", "gather")
CASES = [(family, form) for family in MOE_CONFIGS for form in FORMS]


@pytest.fixture(scope="module")
def moe_artifacts(tmp_path_factory):
    """(family, form) -> (checkpoint, artifact folder, export report)."""
    from dllm_deploy.export.exporter import export
    root = tmp_path_factory.mktemp("moe")
    out = {}
    for family in MOE_CONFIGS:
        ckpt = write_random_checkpoint(root / f"{family}-ckpt", MOE_CONFIGS[family])
        for form in FORMS:
            art = root / f"{family}-{form}"
            out[family, form] = ckpt, art, export(ckpt, art, max_beam_width=4, log=lambda m: None, moe_form=form)
    return out


@pytest.mark.parametrize("family, form", CASES)
def test_the_manifest_records_the_experts(moe_artifacts, family, form):
    _, art, report = moe_artifacts[family, form]
    m = json.loads((art / "manifest.json").read_text())
    assert m["family"] == family and m["model"]["num_experts"] == 8 and m["experts"]["form"] == {"fp32": form}
    import onnx
    ops = {n.op_type for n in onnx.load(str(art / "verify.onnx"), load_external_data=False).graph.node}
    assert ("MoE" in ops) == (form == "contrib") and ("NonZero" in ops) == (form == "gather")
    assert report["parity"]["fp32"]["top1_ids_identical"]
    assert report["parity"]["fp32"]["max_abs_diff"]["prefill_logits"] <= 1e-4


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("family, form", CASES)
def test_torch_ort_and_cpp_decode_the_same_tokens(moe_artifacts, family, form, name, cpp_build, tmp_path):
    from dllm_deploy import Runtime
    ckpt, art, _ = moe_artifacts[family, form]
    options = {"block_length": 8, "gen_length": 16, **STRATEGIES[name]}
    torch_rt, ort_rt = Runtime.load(model=str(ckpt)), Runtime.load(artifact=str(art))
    want = [ort_rt.decoder.generate([p], decode_config(**options))[0].to_dict() for p in PROMPTS]
    ref = [torch_rt.decoder.generate([p], decode_config(**options))[0].to_dict() for p in PROMPTS]
    assert [(w["token_ids"], w["forwards"]) for w in want] == [(r["token_ids"], r["forwards"]) for r in ref]
    assert all(len(set(w["token_ids"])) > 1 for w in want)          # not a degenerate repeat
    got = generate_many(cpp_build, art, PROMPTS, options, tmp_path)
    assert [{k: g[k] for k in KEYS} for g in got] == [{k: w[k] for k in KEYS} for w in want]


@pytest.mark.parametrize("base", ["vanilla", "threshold"])
@pytest.mark.parametrize("family, form", CASES)
def test_lossless_spd_gives_its_base_rules_tokens(moe_artifacts, family, form, base):
    from dllm_deploy import Runtime
    _, art, _ = moe_artifacts[family, form]
    rt = Runtime.load(artifact=str(art))
    for cache in ("auto", "dual"):          # exact (block-causal) or prefix (bidirectional); dual
        opts = {"block_length": 8, "gen_length": 24, "cache": cache}
        one = rt.generate(PROMPTS, config=decode_config(strategy=base, **opts))
        spd = rt.generate(PROMPTS, config=decode_config(strategy="spd", base=base, beam_width=4, **opts))
        assert [r.token_ids for r in spd] == [r.token_ids for r in one]
        assert sum(r.forwards for r in spd) < sum(r.forwards for r in one)


@pytest.mark.parametrize("family, form", [c for c in CASES if MOE_CONFIGS[c[0]].get("block_size")])
def test_the_delayed_cache_decodes_with_the_same_rule(moe_artifacts, family, form, cpp_build, tmp_path):
    """(the block-causal families' delayed cache, one branch per forward: the same rows in C++)"""
    from dllm_deploy import Runtime
    _, art, _ = moe_artifacts[family, form]
    options = {"block_length": 8, "gen_length": 16, "strategy": "threshold", "cache": "delayed"}
    want = Runtime.load(artifact=str(art)).generate(PROMPTS, config=decode_config(**options))
    got = generate_many(cpp_build, art, PROMPTS, options, tmp_path)
    assert [g["token_ids"] for g in got] == [w.token_ids for w in want]


def test_bench_compares_the_forms_per_active_parameter(moe_artifacts, tmp_path):
    """`bench --compare`: the other artifacts' forward cost in the same run, with their parameters
    and active parameters (k of E experts a token)."""
    from dllm_deploy.bench import run as bench
    from dllm_deploy.cli import main
    _, contrib, _ = moe_artifacts["llada2", "contrib"]
    _, gather, _ = moe_artifacts["llada2", "gather"]
    res = bench.run_bench(str(contrib), backends=["ort"], strategies=["threshold"], beam_widths=[1],
                          families=["upper"], n=1, repeats=1, gen_length=16, cost_repeats=1, compare={"gather": str(gather)})
    c = res["compare"]
    assert set(c) == {contrib.name, "gather"}
    assert c["gather"]["params"] == c[contrib.name]["params"] > c["gather"]["active_params"]
    assert c["gather"]["experts"]["form"] == {"fp32": "gather"}
    rows = c["gather"]["forward_cost"]["fp32"]
    assert [r["beam_width"] for r in rows] == [1] and all(r["us_per_token_per_m_active"] > 0 for r in rows)
    assert main(["bench", "--artifact", str(contrib), "--compare", f"x={tmp_path}", "--quiet"]) == 2


@pytest.mark.parametrize("family, form", [("llada2", "contrib"), ("llada_moe", "gather")])
def test_sampled_lossless_spd_is_the_same_in_python_and_cpp(moe_artifacts, family, form, cpp_build, tmp_path):
    """temperature 0.7 / top-p 0.9 with a seed: the routing happens inside the graph, the noise is
    the counter-based one, so C++ draws the same tokens and lossless SPD its base rule's."""
    from dllm_deploy import Runtime
    _, art, _ = moe_artifacts[family, form]
    rt = Runtime.load(artifact=str(art))
    sampled = {"block_length": 8, "gen_length": 16, "temperature": 0.7, "top_p": 0.9, "seed": 3}
    base = rt.generate(PROMPTS, strategy="threshold", **sampled)
    spd = rt.generate(PROMPTS, strategy="spd", base="threshold", beam_width=4, **sampled)
    assert [r.token_ids for r in spd] == [r.token_ids for r in base]
    greedy = rt.generate(PROMPTS, strategy="threshold", block_length=8, gen_length=16)
    assert [r.token_ids for r in greedy] != [r.token_ids for r in base]        # the noise took part
    got = generate_many(cpp_build, art, PROMPTS, {"strategy": "spd", "base": "threshold", "beam_width": 4, **sampled},
                        tmp_path)
    assert [g["token_ids"] for g in got] == [r.token_ids for r in spd]
