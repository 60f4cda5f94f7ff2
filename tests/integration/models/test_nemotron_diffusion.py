"""Nemotron-Labs-Diffusion: the family against transformers' Ministral-3 (its backbone), and the
self-speculative strategies against autoregressive decoding (runtime/self_spec.py).

transformers has no class for the checkpoint; ``Ministral3ForCausalLM`` with ``encoder.`` ->
``model.`` and ``diffusion_head`` -> ``lm_head`` and a 4-D mask computes both of its attention
modes (the facts sheet, §4)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dllm_deploy.errors import UserError
from tests.conftest import write_random_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# odd sizes, head_dim != hidden / heads; the original YaRN window (16) shorter than the positions used
YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1, "rope_theta": 1e6}
RAW = {"model_type": "nemotron_labs_diffusion", "architectures": ["NemotronLabsDiffusionModel"],
       "hidden_size": 44, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 14,
       "num_hidden_layers": 3, "intermediate_size": 70, "vocab_size": 131, "rms_norm_eps": 1e-5,
       "max_position_embeddings": 256, "mask_token_id": 100, "eos_token_id": 11, "block_size": 8,
       "tie_word_embeddings": False, "rope_parameters": YARN}
# a second case: YaRN's attention factor from the scale alone (cos and sin multiplied by 1.277)
RAW_FACTOR = {**RAW, "rope_parameters": {k: v for k, v in YARN.items() if not k.startswith("mscale")}}


def reference(folder):
    """transformers' Ministral3ForCausalLM holding the checkpoint's weights (float64)."""
    from safetensors.torch import load_file
    raw = json.loads((folder / "config.json").read_text())
    hc = transformers.Ministral3Config(
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=raw["num_attention_heads"],
        num_key_value_heads=raw["num_key_value_heads"], head_dim=raw["head_dim"], rms_norm_eps=raw["rms_norm_eps"],
        max_position_embeddings=raw["max_position_embeddings"], tie_word_embeddings=False, sliding_window=None,
        rope_parameters=dict(raw["rope_parameters"]))
    ref = transformers.Ministral3ForCausalLM(hc)
    sd = {k.replace("encoder.", "model.").replace("diffusion_head", "lm_head"): v
          for k, v in load_file(str(folder / "model.safetensors")).items()}
    ref.load_state_dict(sd)
    return ref.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("nld")
    return {name: write_random_checkpoint(root / name, raw, seed=i)
            for i, (name, raw) in enumerate({"yarn": RAW, "factor": RAW_FACTOR}.items())}


def _modes(prefix: int, block: int):
    """The (T,S) masks of a call after ``prefix`` cached positions: causal, the draft (block both
    ways) and a tree (node i's parent i // 2)."""
    causal = np.tril(np.ones((block, block), bool))
    tree = np.eye(block, dtype=bool)
    for i in range(1, block):
        tree[i] |= tree[(i - 1) // 2]
    depth = np.array([int(np.log2(i + 1)) for i in range(block)])
    return {"causal": (causal, np.arange(block)), "draft": (np.ones((block, block), bool), np.arange(block)),
            "tree": (tree, depth)}


@pytest.mark.parametrize("case", ["yarn", "factor"])
def test_logits_and_kv_parity(checkpoints, case):
    """Logits of a causal prefix, then of a causal block, a draft block and a tree over its KV,
    with the prefix KV, fp32 and fp64, against transformers: <= 1e-4 (fp32), with positions past
    the YaRN window."""
    from dllm_deploy.models.loading import load_model
    folder = checkpoints[case]
    ref = reference(folder).double()
    ours, cfg = load_model(str(folder))
    assert cfg.rope_type == "yarn" and cfg.q_scale_beta == 0.1 and cfg.rope_original_max == 16
    assert (cfg.rope_attention_factor == 1.0) == (case == "yarn")
    g = torch.Generator().manual_seed(1)
    b, p, t = 2, 21, 7
    ids = torch.randint(0, 131, (b, p + t), generator=g)
    pos = torch.arange(p + t)[None].repeat(b, 1) + torch.tensor([[0], [19]])     # row 1 starts at 19
    # fp64 within 1e-6: transformers' RMSNorm and rotary tables compute in fp32 whatever the dtype
    for dtype, tol in ((torch.float64, 1e-6), (torch.float32, 1e-4)):
        ours_t = ours.to(dtype).eval()
        for impl in ("sdpa", "eager"):
            ours_t.set_attention(impl)
            pre_mask = torch.ones(b, 1, p, p, dtype=torch.bool).tril()
            with torch.no_grad():
                logits, past = ours_t(ids[:, :p], pos[:, :p], pre_mask)
                want = ref.to(dtype)(input_ids=ids[:, :p], position_ids=pos[:, :p], attention_mask=pre_mask,
                                     use_cache=True)
            assert (logits - want.logits).abs().max() <= tol
            for layer, (k, v) in enumerate(past):
                assert (k - want.past_key_values.layers[layer].keys).abs().max() <= tol
                assert (v - want.past_key_values.layers[layer].values).abs().max() <= tol
            for mode, (m, depth) in _modes(p, t).items():
                full = torch.cat([torch.ones(t, p, dtype=torch.bool), torch.as_tensor(m)], 1)[None, None].repeat(b, 1, 1, 1)
                qpos = pos[:, p:p + 1] + torch.as_tensor(depth)[None]
                with torch.no_grad():
                    got, _ = ours_t(ids[:, p:], qpos, full, past)
                    whole = torch.cat([torch.ones(p, p + t, dtype=torch.bool).tril(), full[0, 0]])[None, None].repeat(b, 1, 1, 1)
                    ref_pos = torch.cat([pos[:, :p], qpos], 1)
                    exp = ref.to(dtype)(input_ids=ids, position_ids=ref_pos, attention_mask=whole).logits[:, p:]
                assert (got - exp).abs().max() <= tol, (dtype, impl, mode)
    ours.set_attention("sdpa")


def _prompts(seed=0, lengths=(5, 9, 3, 12)):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(0, 99, size=k)] for k in lengths]


def _hf_greedy(ref, prompt, n, mask_id, eos):
    """transformers' greedy generate with the mask id excluded (as the SDK's graphs exclude it)."""
    class NoMask(transformers.LogitsProcessor):
        def __call__(self, ids, scores):
            scores[:, mask_id] = -float("inf")
            return scores
    out = ref.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos,
                       logits_processor=transformers.LogitsProcessorList([NoMask()]))[0, len(prompt):].tolist()
    return out[:out.index(eos)] if eos in out else out


@pytest.fixture(scope="module")
def backends(checkpoints, tmp_path_factory):
    from dllm_deploy.export.exporter import export
    from dllm_deploy.models.loading import load_model
    from dllm_deploy.runtime.backends.ort import load_ort
    from dllm_deploy.runtime.backends.torch import TorchBackend
    folder = checkpoints["yarn"]
    module, cfg = load_model(str(folder))
    out = tmp_path_factory.mktemp("nld-art") / "art"
    export(str(folder), out, precisions=["fp32"], log=lambda m: None)
    return {"torch": TorchBackend(module, cfg), "ort": load_ort(out).backend}, cfg, folder


def _run(backend, cfg, prompts, **opts):
    from dllm_deploy.runtime.self_spec import SelfSpecOptions, generate
    return generate(backend, prompts, SelfSpecOptions(**opts), cfg.mask_token_id, cfg.eos_token_id, cfg.block_size)


def test_spec_equals_ar_and_transformers(backends):
    """linear-spec and tree-spec (W 2, 4) give ar's tokens, batch 4 (different prompt lengths) and
    batch 1, on torch and ONNX Runtime; ar equals transformers' greedy decoding."""
    bes, cfg, folder = backends
    prompts = _prompts()
    ref = reference(folder)
    want = [_hf_greedy(ref, p, 24, cfg.mask_token_id, cfg.eos_token_id) for p in prompts]
    for name, be in bes.items():
        ar = _run(be, cfg, prompts, strategy="ar", max_new_tokens=24)
        assert ar.tokens == want, name
        assert ar.forwards == 24                    # the prompt's forward gives the first token
        for strategy, width in (("linear-spec", 1), ("tree-spec", 2), ("tree-spec", 4)):
            res = _run(be, cfg, prompts, strategy=strategy, beam_width=width, max_new_tokens=24)
            assert res.tokens == want, (name, strategy, width)
            assert res.forwards == 1 + 2 * max(len(a) for a in res.accepted)   # a draft and a verify per round
        one = _run(be, cfg, prompts[1:2], strategy="tree-spec", beam_width=4, max_new_tokens=24)
        assert one.tokens == want[1:2]
        for strategy, width in (("linear-spec", 1), ("tree-spec", 4)):     # drafting ahead saves forwards only
            plain = _run(be, cfg, prompts, strategy=strategy, beam_width=width, max_new_tokens=24)
            ahead = _run(be, cfg, prompts, strategy=strategy, beam_width=width, max_new_tokens=24, draft_ahead=True)
            assert ahead.tokens == want and ahead.forwards <= plain.forwards, (name, strategy)


def test_sampled_spec_equals_sampled_ar(backends):
    """Under seeded sampling every strategy gives ar's tokens (the noise is a function of seed,
    request and position); another seed gives other tokens."""
    bes, cfg, _ = backends
    prompts = _prompts(1)
    be = bes["ort"]
    ar = _run(be, cfg, prompts, strategy="ar", max_new_tokens=16, temperature=0.9, seed=5)
    for strategy in ("linear-spec", "tree-spec"):
        assert _run(be, cfg, prompts, strategy=strategy, max_new_tokens=16, temperature=0.9, seed=5).tokens == ar.tokens
    assert _run(be, cfg, prompts, strategy="ar", max_new_tokens=16, temperature=0.9, seed=6).tokens != ar.tokens
    assert _run(be, cfg, prompts, strategy="ar", max_new_tokens=16).tokens != ar.tokens


def test_eos_stops_a_row(backends):
    """A row stops at EOS (dropped from its tokens) while the others go on."""
    bes, cfg, _ = backends
    prompts = _prompts()
    free = _run(bes["ort"], cfg, prompts, strategy="ar", max_new_tokens=12)
    eos = free.tokens[2][4]                      # pretend the 5th token of row 2 is EOS
    from dllm_deploy.runtime.self_spec import SelfSpecOptions, generate
    for strategy in ("ar", "linear-spec", "tree-spec"):
        res = generate(bes["ort"], prompts, SelfSpecOptions(strategy=strategy, max_new_tokens=12), cfg.mask_token_id, eos, 8)
        cut = [t[:t.index(eos)] if eos in t else t for t in free.tokens]
        assert res.tokens == cut and res.stop[2] == "eos"


def test_trie_and_acceptance():
    """The trie holds the W best draft sequences; acceptance walks the causal predictions."""
    from dllm_deploy.runtime.self_spec_trie import accepted_path, best_sequences, build_trie
    ids = np.array([[5, 6], [7, 8], [9, 4]])
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.5, 0.45]])
    assert best_sequences(ids, probs, 1) == [(5, 7, 9)]
    assert best_sequences(ids, probs, 3) == [(5, 7, 9), (5, 7, 4), (5, 8, 9)]
    trie = build_trie(1, ids, probs, 3)
    assert trie.tokens.tolist() == [1, 5, 7, 9, 4, 8, 9] and trie.parent.tolist() == [-1, 0, 1, 2, 2, 1, 5]
    assert trie.depth.tolist() == [0, 1, 2, 3, 3, 2, 3]
    # the model predicts 5 after the seed, 8 after 5 (the runner-up branch), then 9
    assert accepted_path(trie, np.array([5, 8, 0, 0, 0, 9, 3])) == [0, 1, 5, 6]
    assert accepted_path(trie, np.array([2, 0, 0, 0, 0, 0, 0])) == [0]


def test_bad_options_and_configs():
    from dllm_deploy.models.config import DLLMConfig
    from dllm_deploy.runtime.self_spec import SelfSpecOptions
    with pytest.raises(UserError, match="unknown strategy 'spd'"):
        SelfSpecOptions(strategy="spd").check()
    with pytest.raises(UserError, match="block_size"):
        SelfSpecOptions(block_size=1).check()
    with pytest.raises(UserError, match="rope_type 'longrope' is not supported"):
        DLLMConfig.from_hf({**RAW, "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}})
    cfg = DLLMConfig.from_hf({**RAW, "rope_parameters": {"rope_theta": 1e4}})
    assert cfg.rope_type == "default" and cfg.q_scale_beta == 0 and cfg.layout == "nemotron_diffusion"


def test_cli_generate_and_bench(backends, tmp_path, capsys):
    """`generate` and `bench` on a self-speculative artifact: its own strategies, JSON, one-line refusals."""
    from dllm_deploy.cli import main
    art = str(backends[0]["ort"].folder)
    assert main(["generate", "--artifact", art, "--prompt", "upper: ab", "--gen-length", "12", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["strategy"] == "tree-spec" and d["tokens"] == len(d["token_ids"]) <= 12 and d["forwards"] >= 1
    assert main(["generate", "--artifact", art, "--prompt", "upper: ab", "--gen-length", "12", "--strategy", "ar",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == d["token_ids"]
    assert main(["generate", "--artifact", art, "--prompt", "upper: ab", "--gen-length", "12", "--stream"]) == 0
    streamed = capsys.readouterr().out
    assert streamed.endswith("\n") and streamed[:-1] == d["text"]       # the rounds' text, then a newline
    assert main(["generate", "--artifact", art, "--prompt", "upper: ab", "--prompt", "kv", "--gen-length", "12",
                 "--stream", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    chunks = [c for c in lines if "index" in c]
    assert "".join(c["delta"] for c in chunks if c["index"] == 0) == d["text"]
    assert lines[-1]["results"][0]["token_ids"] == d["token_ids"]
    stop = d["text"][len(d["text"]) // 2:][:2]
    assert stop and main(["generate", "--artifact", art, "--prompt", "upper: ab", "--gen-length", "12", "--stop", stop,
                          "--json"]) == 0
    cut = json.loads(capsys.readouterr().out)
    assert cut["text"] == d["text"][:d["text"].index(stop)] and cut["finish_reason"] == "stop"
    for args, msg in ((["--cache", "dual"], "--cache does not apply to a self-speculative model"),
                      (["--strategy", "spd"], "unknown strategy 'spd' for a self-speculative model"),
                      (["--gen-length", "400"], "exceeds the model's max_seq 256")):
        assert main(["generate", "--artifact", art, "--prompt", "upper: ab", *args]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1
    out = tmp_path / "bench.json"
    assert main(["bench", "--artifact", art, "--quick", "--quiet", "--json-out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["label"] for r in res["runs"]] == ["ar", "linear-spec", "tree-spec W4", "fastdiffuser"]
    assert res["lossless"] and all(r["identical_to_ar"] for r in res["runs"] if r["strategy"] != "fastdiffuser")
    assert res["runs"][0]["tpf"] == 1.0 and res["runs"][1]["forwards"] > res["runs"][0]["forwards"] / 2


def test_runtime_api(backends):
    """Runtime.self_spec and Runtime.generate / stream decode (ar's tokens, batched; per-row budgets,
    sampling and stop strings; chunks that add up to the result)."""
    from dllm_deploy import Runtime
    rt = Runtime.load(artifact=str(backends[0]["ort"].folder))
    spec = rt.self_spec(["upper: ab", "kv"], max_new_tokens=10, beam_width=2)
    ar = rt.self_spec(["upper: ab", "kv"], strategy="ar", max_new_tokens=10)
    assert [r["token_ids"] for r in spec] == [r["token_ids"] for r in ar] and len(spec[0]["token_ids"]) == 10
    assert spec[0]["text"] == rt.tokenizer.decode(spec[0]["token_ids"])
    from dllm_deploy.runtime.rows import RowOptions
    assert rt.strategies == ("ar", "linear-spec", "tree-spec", "fastdiffuser") and rt.joins_batches()
    gen = rt.generate(["upper: ab", "kv"], strategy="tree-spec", beam_width=2, gen_length=10)
    assert [r.token_ids for r in gen] == [r["token_ids"] for r in ar] and gen[0].forwards == spec[0]["forwards"]
    assert sum(k * v for k, v in gen[0].accepted_hist.items()) + 1 == 10     # the prompt's forward gave the first
    sampled = RowOptions(temperature=0.9, seed=4)
    rows = [sampled, RowOptions(max_tokens=4)]
    alone = rt.generate(["upper: ab"], [sampled], strategy="ar", gen_length=10)[0]
    mixed = rt.generate(["upper: ab", "kv"], rows, strategy="tree-spec", gen_length=10)
    assert mixed[0].token_ids == alone.token_ids != gen[0].token_ids          # sampled: batch-invariant, lossless
    assert mixed[1].token_ids == gen[1].token_ids[:4] and mixed[1].finish_reason == "length"
    chunks = list(rt.stream(["upper: ab", "kv"], rows=rows, strategy="linear-spec", gen_length=10))
    for i, r in enumerate(mixed):
        mine = [c for c in chunks if c["index"] == i]
        assert sum((c["token_ids"] for c in mine), []) == r.token_ids and mine[-1]["finish_reason"] == r.finish_reason
    with pytest.raises(UserError, match="--cache does not apply to a self-speculative model"):
        rt.generate("upper: ab", cache="dual")
    with pytest.raises(UserError, match="fastdiffuser decodes greedily"):
        rt.generate(["upper: ab"], [sampled], strategy="fastdiffuser")
    with pytest.raises(UserError, match="unknown self-speculative option"):
        rt.self_spec("x", cache="dual")


def test_draft_adapter_folds_into_the_draft_only(tmp_path):
    """A PEFT LoRA in linear_spec_lora/ (o_proj, as NVIDIA ships it) changes the draft graph
    exactly as PEFT's merge does, leaves the causal graph the base model, and the decode stays ar's."""
    peft = pytest.importorskip("peft")
    from safetensors.torch import load_file, save_file

    from dllm_deploy.export.exporter import export
    from dllm_deploy.runtime.backends.ort import load_ort
    ckpt = write_random_checkpoint(tmp_path / "ckpt", RAW, seed=3)
    base = reference(ckpt)
    torch.manual_seed(0)
    adapted = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=16, target_modules=["o_proj"]))
    for n, p in adapted.named_parameters():
        if "lora_" in n:
            torch.nn.init.normal_(p, 0, 0.3)
    adapted.save_pretrained(str(tmp_path / "peft"))
    theirs = {k.replace("base_model.model.model.", "base_model.model.encoder."): v
              for k, v in load_file(str(tmp_path / "peft" / "adapter_model.safetensors")).items()}
    (ckpt / "linear_spec_lora").mkdir()
    save_file(theirs, str(ckpt / "linear_spec_lora" / "adapter_model.safetensors"))
    (ckpt / "linear_spec_lora" / "adapter_config.json").write_text((tmp_path / "peft" / "adapter_config.json").read_text())
    export(str(ckpt), tmp_path / "art", log=lambda m: None)
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["draft_adapter"]["scale"] == 4.0 and manifest["draft_adapter"]["weights"] == RAW["num_hidden_layers"]
    be = load_ort(tmp_path / "art").backend
    merged = peft.PeftModel.from_pretrained(reference(ckpt), str(tmp_path / "peft")).merge_and_unload().eval()
    plain = reference(ckpt)
    ids = np.random.default_rng(0).integers(0, 99, size=(1, 12))
    pos = np.arange(12)[None]
    for graph, want, mask in (("verify", merged, np.ones((12, 12), bool)), ("prefill", plain, np.tril(np.ones((12, 12), bool)))):
        cache = be.new_cache(1, 0)
        call = be.verify if graph == "verify" else lambda *a: be.prefill(*a, keep=12)
        top_i, top_p = call(cache, ids, pos, mask[None, None])
        with torch.no_grad():
            logits = want(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)[None, None]).logits[0]
        logits[:, RAW["mask_token_id"]] = -float("inf")
        probs = torch.softmax(logits.double(), -1)
        assert (top_i[0, :, 0] == logits.argmax(-1).numpy()).all(), graph
        assert np.abs(top_p[0, :, 0] - probs.max(-1).values.numpy()).max() < 1e-4, graph
        if graph == "verify":       # the adapter changes the draft: the base model would choose otherwise
            with torch.no_grad():
                other = plain(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)[None, None]).logits[0]
            assert (other.argmax(-1).numpy() != top_i[0, :, 0]).any()
    prompts = _prompts(2)
    cfg = be.config
    ar = _run(be, cfg, prompts, strategy="ar", max_new_tokens=16)
    assert _run(be, cfg, prompts, strategy="tree-spec", beam_width=4, max_new_tokens=16).tokens == ar.tokens


def _fastdiffuser_reference(ref, prompt, n, L, tau, mask_id, eos):
    """The block-diffusion mode written from its description (the facts sheet, §3) over
    transformers' model, recomputing every forward from the tokens: a causal forward gives the
    seed; each block [seed, MASK x (L-1)] attends the prefix and itself both ways and commits the
    masked positions whose probability reaches tau (at least the most confident one); the finished
    block's causal forward gives the next seed."""
    def logits(tokens, block):
        p = len(tokens) - block
        m = torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()
        m[p:, p:] = True
        with torch.no_grad():
            z = ref(input_ids=torch.tensor([tokens]), attention_mask=m[None, None]).logits[0]
        z[:, mask_id] = -float("inf")
        return torch.softmax(z.double(), -1)
    out = [int(logits(prompt, 0)[-1].argmax())]
    while len(out) < n and eos not in out:
        block = [out[-1]] + [mask_id] * (L - 1)
        while mask_id in block:
            probs = logits(prompt + out[:-1] + block, L)[-L:]
            conf, top = probs.max(-1)
            masked = [i for i in range(L) if block[i] == mask_id]
            best = max(masked, key=lambda i: float(conf[i]))
            for i in masked:
                if i == best or conf[i] >= tau:
                    block[i] = int(top[i])
        causal = logits(prompt + out[:-1] + block, 0)
        out += block[1:] + [int(causal[-1].argmax())]
    out = out[:out.index(eos)] if eos in out else out
    return out[:n]


def test_fastdiffuser_follows_the_block_diffusion_rule(backends):
    """fastdiffuser (lossy) gives the tokens of the rule run over transformers' model, batch 1 and
    inside a batch of 4; at threshold 1 every draft commits one token (L forwards a block)."""
    bes, cfg, folder = backends
    ref = reference(folder)
    prompts = _prompts(3)
    for tau in (0.3, 1.0):
        want = [_fastdiffuser_reference(ref, p, 20, cfg.block_size, tau, cfg.mask_token_id, cfg.eos_token_id)
                for p in prompts]
        for be in bes.values():
            res = _run(be, cfg, prompts, strategy="fastdiffuser", threshold=tau, max_new_tokens=20)
            assert res.tokens == want, tau
    one = _run(bes["ort"], cfg, prompts[:1], strategy="fastdiffuser", threshold=1.0, max_new_tokens=20)
    blocks = len(one.accepted[0])
    assert one.forwards == 1 + blocks * cfg.block_size      # L-1 drafts and a causal forward per block
    with pytest.raises(UserError, match="greedily"):
        _run(bes["ort"], cfg, prompts, strategy="fastdiffuser", temperature=0.5)


def test_rows_join_a_running_batch(backends):
    """Continuous batching: rows that join at round boundaries (the scheduler's join) decode what
    they decode alone, and so do the rows already running; on torch and ONNX Runtime."""
    from dllm_deploy.runtime.rows import RowOptions
    from dllm_deploy.runtime.self_spec import SelfSpecOptions, SelfSpecRun
    bes, cfg, _ = backends
    prompts = _prompts()

    def decode(be, opts, prompts, rows, join=None):
        run = SelfSpecRun(be, prompts, opts, cfg.mask_token_id, cfg.eos_token_id, cfg.block_size, rows=rows, join=join)
        for _ in run:
            pass
        return run.res

    for name, be in bes.items():
        for strategy, ahead in (("linear-spec", False), ("tree-spec", False), ("tree-spec", True), ("fastdiffuser", False)):
            sampled = RowOptions() if strategy == "fastdiffuser" else RowOptions(temperature=0.8, seed=3)
            rows = [RowOptions(), sampled, RowOptions(max_tokens=7), RowOptions(), RowOptions()]
            order = [prompts[0], prompts[1], prompts[2], prompts[3], prompts[1]]
            pending = [[(order[2], rows[2])], [], [(order[3], rows[3]), (order[4], rows[4])]]
            opts = SelfSpecOptions(strategy=strategy, beam_width=2, max_new_tokens=20, draft_ahead=ahead)
            res = decode(be, opts, order[:2], rows[:2], join=lambda: pending.pop(0) if pending else [])
            assert not pending and len(res.tokens) == 5
            for i, (p, o) in enumerate(zip(order, rows)):
                alone = decode(be, opts, [p], [o])
                assert (res.tokens[i], res.accepted[i]) == (alone.tokens[0], alone.accepted[0]), (name, strategy, i)


def test_a_profiles_int8_gives_way_to_fp32(checkpoints, tmp_path):
    """A profile whose precision is int8 (per-call activation scales: not ar's output at near-ties)
    loads a self-speculative artifact's fp32 and says why; asked for by name, int8 loads."""
    from dllm_deploy import Runtime
    from dllm_deploy.export.exporter import export
    art = tmp_path / "art"
    export(str(checkpoints["yarn"]), art, precisions=["fp32", "int8"], log=lambda m: None)
    rt = Runtime.load(artifact=str(art), profile="cpu-arm64")
    assert rt.profile.precision == "int8" and rt.backend.precision == "fp32"
    assert any("not the profile's int8" in str(r) for r in rt.profile_reasons)
    assert Runtime.load(artifact=str(art), profile="cpu-arm64", precision="int8").backend.precision == "int8"
