"""DiffusionGemma's text model (models/diffusion_gemma.py) against transformers 5.23's
DiffusionGemmaForBlockDiffusion (eager attention and experts) on a tiny random checkpoint with
sliding and full layers of different head widths and KV heads, several experts, a sliding
window shorter than the prompt and a left-padded batch: the encoder's KV cache and the
decoder's logits, with and without self-conditioning, in float64 and float32."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

TEXT = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            num_experts=4, top_k_experts=2, moe_intermediate_size=32, max_position_embeddings=512,
            use_bidirectional_attention="vision", pad_token_id=0, eos_token_id=1, bos_token_id=2)
VISION = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=2, head_dim=16)
CANVAS, PROMPT, PAD = 8, 12, 4          # row 1 of the batch is left-padded by PAD


def _random_checkpoint(folder, std: float, spread: float):
    """A random DiffusionGemma checkpoint saved by transformers: matrices N(0, std), norm weights,
    router scales and both roles' layer scalars 1 +- ``spread``."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(text_config=TEXT, vision_config=VISION,
                                                                 canvas_length=CANVAS)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vision" not in name:
                p.copy_(1 + spread * torch.randn_like(p) if p.ndim == 1 else std * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(1 + spread * (2 * torch.rand_like(b) - 1))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Large random weights: every path of the model shows in the outputs (the parity tests)."""
    return _random_checkpoint(tmp_path_factory.mktemp("diffusion_gemma"), 0.3, 0.5)


@pytest.fixture(scope="module")
def tame_checkpoint(diffusion_gemma_export):
    """Weights at about 1 / sqrt(fan-in): fp32 rounding stays near 1e-6 through the steps instead
    of being amplified into near-ties (the decode tests compare implementations' tokens)."""
    return diffusion_gemma_export[0]


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, TEXT["vocab_size"], (2, PROMPT), generator=g)
    keep = torch.ones(2, PROMPT, dtype=torch.bool)
    keep[1, :PAD] = False
    ids[1, :PAD] = TEXT["pad_token_id"]
    canvas = torch.randint(0, TEXT["vocab_size"], (2, CANVAS), generator=g)
    sc = torch.randn(2, CANVAS, TEXT["vocab_size"], generator=g) * 3
    return ids, keep, canvas, sc


def _reference(folder, dtype, ids, keep, canvas, sc):
    """transformers: the encoder's DynamicCache, then the decoder's logits, built as its
    generate() builds them (positions shared by every row, 2-D masks turned into its mask maps)."""
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.cache_utils import DynamicCache
    ref = DiffusionGemmaForBlockDiffusion.from_pretrained(folder, dtype=dtype, attn_implementation="eager",
                                                          experts_implementation="eager").eval()
    b = ids.shape[0]
    cache = DynamicCache(config=ref.config.text_config)
    pos = torch.arange(PROMPT)[None]
    with torch.no_grad():
        masks = ref.model.encoder.create_masks_for_generate(
            config=ref.config, inputs_embeds=torch.empty(b, PROMPT, 0, dtype=dtype), attention_mask=keep,
            past_key_values=cache, position_ids=pos)
        ref.model.encoder(input_ids=ids, attention_mask=masks, position_ids=pos, past_key_values=cache)
        kv = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        dmask = torch.nn.functional.pad(keep, (0, CANVAS), value=True)
        mapping = ref.model.decoder.create_diffusion_decoder_attention_mask(
            config=ref.config, inputs_embeds=torch.empty(b, CANVAS, 0, dtype=dtype), past_key_values=cache,
            decoder_attention_mask=dmask)
        logits = {}
        for label, s in (("first step", None), ("self-conditioned", sc.to(dtype))):
            logits[label] = ref(past_key_values=cache, decoder_input_ids=canvas, self_conditioning_logits=s,
                                decoder_attention_mask=mapping,
                                decoder_position_ids=torch.arange(PROMPT, PROMPT + CANVAS)[None]).logits
    return kv, logits


def _rows(dtype):
    """The batch rows to compare: in float64 transformers turns a left-padded row into NaN (its
    fp64 mask value becomes -inf in the fp32 softmax), so only the unpadded row there; both in fp32."""
    return [0] if dtype == torch.float64 else [0, 1]


def _ours(folder, dtype, ids, keep, canvas, sc):
    from dllm_deploy.models.diffusion_gemma import decoder_masks, encoder_masks, load_diffusion_gemma
    module, cfg = load_diffusion_gemma(folder, dtype=dtype)
    b, w = ids.shape[0], cfg.sliding_window
    pos = torch.arange(PROMPT).expand(b, -1)
    with torch.no_grad():
        kv = module.encode(ids, pos, encoder_masks(keep, 0, PROMPT, w), module.empty_past(b, dtype))
        masks = decoder_masks(keep, PROMPT, CANVAS, w)
        dpos = torch.arange(PROMPT, PROMPT + CANVAS).expand(b, -1)
        zero = torch.zeros(b, CANVAS, cfg.hidden_size, dtype=dtype)
        logits = {"first step": module.denoise(canvas, dpos, masks, kv, zero),
                  "self-conditioned": module.denoise(canvas, dpos, masks, kv, module.soft_embeddings(sc.to(dtype)))}
    return kv, logits, cfg


@pytest.mark.parametrize("dtype,bound,logit_bound", [(torch.float64, 1e-10, 1e-10), (torch.float32, 1e-4, 1e-4)])
def test_encoder_kv_and_decoder_logits_match_transformers(checkpoint, dtype, bound, logit_bound):
    ids, keep, canvas, sc = _inputs()
    ref_kv, ref_logits = _reference(checkpoint, dtype, ids, keep, canvas, sc)
    kv, logits, cfg = _ours(checkpoint, dtype, ids, keep, canvas, sc)
    assert cfg.layer_types == ("sliding", "full", "sliding", "full") and cfg.head_dims == (16, 32, 16, 32)
    assert cfg.sliding_window < PROMPT
    for i, ((k, v), (rk, rv)) in enumerate(zip(kv, ref_kv)):
        real = keep
        if cfg.layer_types[i] == "sliding":            # both keep the last W - 1 keys
            assert rk.shape[2] == k.shape[2] == cfg.sliding_window - 1
            real = keep[:, -rk.shape[2]:]
        rows = _rows(dtype)
        for ours, theirs in ((k, rk), (v, rv)):
            assert ours.shape == theirs.shape and torch.isfinite(ours).all()
            diff = (ours - theirs).abs().amax(dim=(1, 3))[rows]                  # (rows, keys)
            assert diff[real[rows]].max() <= bound, (i, diff)
    for label in ref_logits:
        assert torch.isfinite(logits[label]).all()
        ours, theirs = logits[label][rows], ref_logits[label][rows]
        assert (ours - theirs).abs().max() <= logit_bound, (label, (ours - theirs).abs().max())
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert not torch.allclose(logits["first step"], logits["self-conditioned"])    # the conditioning is used


def test_the_config_is_read_from_the_nested_text_config_and_refusals_are_one_line(checkpoint):
    import json

    from dllm_deploy.errors import UserError
    from dllm_deploy.models.diffusion_gemma import DiffusionGemmaConfig
    raw = json.loads((checkpoint / "config.json").read_text())
    cfg = DiffusionGemmaConfig.from_hf(raw)
    assert (cfg.kv_heads, cfg.num_experts, cfg.experts_per_token, cfg.canvas_length) == ((2, 1, 2, 1), 4, 2, CANVAS)
    for change, message in ((("use_bidirectional_attention", "all"), "use_bidirectional_attention 'all' is not supported"),
                            (("hidden_activation", "silu"), "hidden_activation 'silu' is not supported"),
                            (("num_experts", None), "num_experts, top_k_experts and moe_intermediate_size are required")):
        bad = {**raw, "text_config": {**raw["text_config"], change[0]: change[1]}}
        with pytest.raises(UserError, match=message):
            DiffusionGemmaConfig.from_hf(bad)
    with pytest.raises(UserError, match="missing key text_config.vocab_size"):
        DiffusionGemmaConfig.from_hf({**raw, "text_config": {k: v for k, v in raw["text_config"].items() if k != "vocab_size"}})


def _transformers_generate(folder, monkeypatch, prompts, dtype, **options):
    from transformers import DiffusionGemmaForBlockDiffusion
    ref = DiffusionGemmaForBlockDiffusion.from_pretrained(folder, dtype=dtype, attn_implementation="eager",
                                                          experts_implementation="eager").eval()
    p = max(len(x) for x in prompts)
    ids = torch.tensor([[TEXT["pad_token_id"]] * (p - len(x)) + x for x in prompts])
    keep = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    from dllm_deploy.models.diffusion_gemma_decode import inverse_cdf
    from dllm_deploy.runtime.uniform_diffusion import TransformersDraws
    draws = TransformersDraws(p, CANVAS, options["max_denoising_steps"])
    # an upstream bug: generate() builds the decoder's masks from the canvas ids (int64), and the
    # eager masks of a padded batch then fail on torch.finfo(int64); give it a float stand-in
    decoder = type(ref.model.decoder)
    masks = decoder.create_diffusion_decoder_attention_mask
    monkeypatch.setattr(decoder, "create_diffusion_decoder_attention_mask", staticmethod(
        lambda config, inputs_embeds, **kw: masks(config=config, inputs_embeds=inputs_embeds.to(dtype), **kw)))
    monkeypatch.setattr(torch, "randint", lambda low, high, size, **kw: torch.from_numpy(draws.randint(high, size[0])))
    monkeypatch.setattr(torch, "multinomial", lambda probs, num_samples=1, **kw:
                        inverse_cdf(probs, torch.from_numpy(draws.uniforms(probs.shape[0])))[:, None])
    if "entropy_bound" in options:
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig
        options["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(options.pop("entropy_bound")))
    eos = options.pop("eos_token_id", TEXT["eos_token_id"])
    with torch.no_grad():      # the tiny checkpoint's generation_config.json names no EOS or pad: given here
        out = ref.generate(ids, attention_mask=keep, eos_token_id=eos, pad_token_id=TEXT["pad_token_id"], **options)
    monkeypatch.undo()
    return out


def _ours_generate(folder, prompts, dtype, **options):
    from dllm_deploy.models.diffusion_gemma import load_diffusion_gemma
    from dllm_deploy.models.diffusion_gemma_decode import TorchDenoiser
    from dllm_deploy.runtime.uniform_diffusion import UniformDiffusionOptions, generate
    module, cfg = load_diffusion_gemma(folder, dtype=dtype)
    options = dict(options)
    eos = options.pop("eos_token_id", cfg.eos_token_id)
    return generate(TorchDenoiser(module, dtype), prompts, UniformDiffusionOptions(**options),
                    vocab_size=cfg.vocab_size, canvas_length=cfg.canvas_length, eos_ids=[eos], pad_id=cfg.pad_token_id)


def _with_an_eos(folder, options: dict) -> dict:
    """``options`` with an EOS id the decode meets: row 1's fourth token of its first canvas when
    decoded with none (these random weights rarely draw the config's EOS), absent from row 0's."""
    free = _ours_generate(folder, PROMPTS, torch.float32, **{**options, "eos_token_id": -1})
    eos = next(int(x) for x in free.new_tokens[1, 3:CANVAS] if x not in free.new_tokens[0])
    return {**options, "eos_token_id": eos}


PROMPTS = [[5, 17, 33, 41, 9, 12, 77, 101, 64, 3, 250, 18], [7, 7, 90, 31, 44, 120, 8, 15]]
EQUAL = [PROMPTS[0], PROMPTS[0][::-1]]


# sharp temperatures and a high confidence bar: rows stop early at different steps
EARLY = {"max_new_tokens": 24, "max_denoising_steps": 3, "t_min": 0.05, "t_max": 0.3, "entropy_bound": 1.0,
         "confidence_threshold": 2.0, "stability_threshold": 0}


# float64 (rounding cannot tell the two apart) on prompts of one length: transformers turns a
# left-padded row into NaN in float64 (_rows); the padded batch runs in float32
@pytest.mark.parametrize("prompts,dtype", [(EQUAL, torch.float64), (PROMPTS, torch.float32)], ids=["fp64", "fp32-padded"])
@pytest.mark.parametrize("case", ["defaults", "early-stop-eos"])
def test_generate_is_token_identical_to_transformers_with_the_same_noise(tame_checkpoint, monkeypatch, case, prompts,
                                                                        dtype):
    options = {"max_new_tokens": 24, "max_denoising_steps": 5} if case == "defaults" else _with_an_eos(tame_checkpoint, EARLY)
    ref = _transformers_generate(tame_checkpoint, monkeypatch, prompts, dtype, **dict(options))
    ours = _ours_generate(tame_checkpoint, prompts, dtype, **options)
    assert ours.sequences.tolist() == ref.sequences.tolist()
    assert ours.tokens_per_forward.tolist() == pytest.approx(ref.tokens_per_forward.tolist())
    _check_case(case, ours, options, prompts)


def _check_case(case: str, result, options: dict, prompts) -> None:
    """The case exercises what it is named for."""
    full = -(-options["max_new_tokens"] // CANVAS) * options["max_denoising_steps"]
    if case == "defaults":
        assert (result.forwards == full).all()
        return
    assert (result.forwards < full).all()
    if prompts is PROMPTS:
        assert (result.new_tokens[1] == options["eos_token_id"]).any() and (result.new_tokens[1] == TEXT["pad_token_id"]).any()


def test_decoding_defaults_come_from_generation_config(checkpoint, tmp_path):
    import json
    import shutil

    from dllm_deploy.models.diffusion_gemma import DiffusionGemmaConfig, generation_defaults
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    cfg = DiffusionGemmaConfig.from_file(folder / "config.json")
    assert generation_defaults(folder, cfg) == {"eos_ids": [1], "pad_id": 0, "options": {}}    # the saved file sets none
    (folder / "generation_config.json").write_text(json.dumps({
        "eos_token_id": [1, 106], "pad_token_id": 0, "max_denoising_steps": 32, "t_min": 0.3,
        "sampler_config": {"entropy_bound": 0.2, "_cls_name": "EntropyBoundSamplerConfig"}}))
    assert generation_defaults(folder, cfg) == {"eos_ids": [1, 106], "pad_id": 0,
                                                "options": {"max_denoising_steps": 32, "t_min": 0.3, "entropy_bound": 0.2}}


def test_commands_that_do_not_take_diffusion_gemma_yet_say_so_in_one_line(checkpoint, artifact, tmp_path):
    from dllm_deploy.artifact import read_manifest
    from dllm_deploy.errors import UserError
    from dllm_deploy.export.exporter import export
    from dllm_deploy.models.config import DLLMConfig
    with pytest.raises(UserError, match="DiffusionGemma exports fp32 only so far"):
        export(checkpoint, tmp_path / "out", precisions=["fp32", "int4"], log=lambda m: None)
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserError, match="a DiffusionGemma artifact; this command does not run it yet .generate, serve"):
        read_manifest(artifact)
    with pytest.raises(UserError, match="model_type 'diffusion_gemma' is recognised but not supported .only `dllm-deploy export` takes the checkpoint"):
        DLLMConfig.from_file(checkpoint / "config.json")


@pytest.fixture(scope="module")
def artifact(diffusion_gemma_export):
    """``dllm-deploy export``'s path (exporter.export: target checks, lock, swap-in)."""
    _, out, res = diffusion_gemma_export
    assert set(res["parity"]["fp32"]["graphs"]) == {"encode", "denoise"}
    return out


def test_the_exported_graphs_match_the_torch_module(artifact):
    """export's own parity check (ONNX Runtime vs the torch module run a layer at a time, three
    shapes, a left-padded row), recorded in the manifest; the ids the denoise graph returns are
    equal, the floats within 1e-4."""
    import json
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert set(manifest["parity"]) == {"encode", "denoise"} and max(manifest["parity"].values()) <= 1e-4
    assert sorted(p.name for p in artifact.iterdir()) == ["denoise.onnx", "encode.onnx", "generation_config.json",
                                                          "manifest.json", "weights.bin"]


@pytest.mark.parametrize("case", ["defaults", "early-stop-eos"])
def test_onnx_runtime_generate_is_token_identical_to_transformers(tame_checkpoint, artifact, monkeypatch, case):
    """The exported graphs on ONNX Runtime (no logits leave them) decode the tokens transformers'
    generate() gives with the same noise: a left-padded batch, three canvases, early stops, an EOS.
    Three steps a canvas: ONNX Runtime's fp32 kernels round differently from torch's, and the
    self-conditioning loop amplifies that difference about fivefold a step on random weights
    (torch float32 against float64 shows the same growth), until it flips a near-tie."""
    from dllm_deploy.runtime.backends.diffusion_gemma_ort import OrtDenoiser
    from dllm_deploy.runtime.uniform_diffusion import UniformDiffusionOptions, generate
    options = {"max_new_tokens": 24, "max_denoising_steps": 3} if case == "defaults" else _with_an_eos(tame_checkpoint, EARLY)
    ref = _transformers_generate(tame_checkpoint, monkeypatch, PROMPTS, torch.float32, **dict(options))
    backend = OrtDenoiser(artifact)
    m = backend.manifest["model"]
    rows_fed, denoise = [], backend.denoise

    def counting(canvas, *rest):
        rows_fed.append(len(canvas))
        return denoise(canvas, *rest)
    backend.denoise = counting
    opts = {k: v for k, v in options.items() if k != "eos_token_id"}
    ours = generate(backend, PROMPTS, UniformDiffusionOptions(**opts), vocab_size=m["vocab_size"],
                    canvas_length=m["canvas_length"], eos_ids=[options.get("eos_token_id", m["eos_token_id"])],
                    pad_id=m["pad_token_id"])
    assert ours.sequences.tolist() == ref.sequences.tolist()
    assert ours.tokens_per_forward.tolist() == pytest.approx(ref.tokens_per_forward.tolist())
    assert backend.calls["encode"] == ours.encoder_forwards
    assert sum(rows_fed) == ours.forwards.sum()          # a step runs the rows that have not stopped, only
    _check_case(case, ours, options, PROMPTS)


def test_the_export_command_prints_each_graphs_parity(tame_checkpoint, tmp_path, capsys):
    from dllm_deploy import cli
    assert cli.main(["export", "--model", str(tame_checkpoint), "--out", str(tmp_path / "art")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"artifact {tmp_path / 'art'}") and "parity vs torch: encode " in out[1] and "denoise " in out[1]


def test_the_runtime_generates_streams_and_stops_text(artifact, capsys):
    """Runtime.load takes the artifact (text through its tokenizer: here the byte tokenizer) and
    decodes as the rule does (request word 0: a row's tokens are a function of its prompt and
    seed alone, so a row decodes in a batch what it decodes alone); chunks come a canvas at a
    time and add up to the results; budgets and stop strings cut rows; the CLI prints the same."""
    import json

    from dllm_deploy import Runtime, cli
    from dllm_deploy.errors import UserError
    from dllm_deploy.runtime.backends.diffusion_gemma_ort import OrtDenoiser
    from dllm_deploy.runtime.rows import RowOptions
    from dllm_deploy.runtime.uniform_diffusion import UniformDiffusionOptions, UniformRun
    rt = Runtime.load(artifact=str(artifact))
    assert rt.kind == "uniform" and rt.strategies == ("uniform-diffusion",) and rt.joins_batches()
    prompts = ["hello there", "abc"]
    got = rt.generate(prompts, gen_length=24, steps=3)
    m = OrtDenoiser(artifact).manifest
    run = UniformRun(OrtDenoiser(artifact), [rt.tokenizer.encode(p) for p in prompts],
                     UniformDiffusionOptions(max_new_tokens=24, max_denoising_steps=3), vocab_size=m["model"]["vocab_size"],
                     canvas_length=CANVAS, eos_ids=m["decoding"]["eos_ids"], pad_id=m["decoding"]["pad_id"],
                     request_ids=[0, 0], own_positions=True)
    for _ in run:
        pass
    core = run.result()
    eos = m["decoding"]["eos_ids"]
    for i, (r, row) in enumerate(zip(got, core.new_tokens.tolist())):
        ids = [x for x in row if x != m["decoding"]["pad_id"]]          # the rule pads after an EOS
        assert r.token_ids == ids and r.finish_reason == ("eos" if set(ids) & set(eos) else "length")
        assert r.forwards == core.forwards[i] + run.encoder_rows[i]       # decoder steps + encoder forwards
    assert {r.finish_reason for r in got} == {"eos", "length"}           # the case holds both
    assert rt.generate(prompts[1:], gen_length=24, steps=3)[0].token_ids == got[1].token_ids
    seeded = rt.generate(prompts[:1], [RowOptions(seed=9)], gen_length=24, steps=3)[0]
    assert seeded.token_ids != got[0].token_ids
    chunks = list(rt.stream(prompts, rows=[RowOptions(max_tokens=12), RowOptions()], gen_length=24, steps=3))
    first = [c for c in chunks if c["index"] == 0]
    assert len(first) == 2 and sum((c["token_ids"] for c in first), []) == got[0].token_ids[:12]   # a canvas of 8, then 4
    assert first[-1]["finish_reason"] == "length" and first[0]["forwards"] == 4     # 3 steps and the prompt's encode
    assert sum((c["token_ids"] for c in chunks if c["index"] == 1), []) == got[1].token_ids
    stop = got[1].text[5:7]
    cut = rt.generate(prompts[1:], [RowOptions(stop=(stop,))], gen_length=24, steps=3)[0]
    assert cut.finish_reason == "stop" and cut.text == got[1].text[:got[1].text.index(stop)]
    for bad, msg in (({"temperature": 0.5}, "does not apply to a uniform-diffusion model"),
                     ({"strategy": "spd"}, "unknown strategy 'spd'"), ({"cache": "dual"}, "--cache does not apply")):
        with pytest.raises(UserError, match=msg):
            rt.generate(prompts, **bad)
    assert cli.main(["generate", "--artifact", str(artifact), "--prompt", "abc", "--gen-length", "24", "--steps", "3",
                     "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["token_ids"] == got[1].token_ids and d["strategy"] == "uniform-diffusion" and d["steps"] == 3


def test_rows_join_a_running_batch_at_canvas_boundaries(artifact):
    """Continuous batching: requests that join at canvas boundaries (one longer than the batch's
    prompts, one shorter) decode, and count forwards, what they do alone, and so do the rows
    already running; finished rows leave the batch."""
    from dllm_deploy import Runtime
    from dllm_deploy.runtime.rows import RowOptions
    rt = Runtime.load(artifact=str(artifact))
    first = ["hello there", "abc"]
    late = [("the quick brown fox jumps", RowOptions(seed=4)), ("x", RowOptions(max_tokens=9))]
    pending = [[], [late[0]], [late[1]]]
    chunks = list(rt.stream(first, join=lambda: pending.pop(0) if pending else [], gen_length=32, steps=3))
    assert not pending
    prompts, rows = first + [p for p, _ in late], [RowOptions(), RowOptions()] + [o for _, o in late]
    for i, (prompt, row) in enumerate(zip(prompts, rows)):
        alone = rt.generate([prompt], [row], gen_length=32, steps=3)[0]
        mine = [c for c in chunks if c["index"] == i]
        assert sum((c["token_ids"] for c in mine), []) == alone.token_ids, i
        assert mine[-1]["finish_reason"] == alone.finish_reason and mine[-1]["forwards"] == alone.forwards, i


def test_bench_runs_ours_against_transformers(tame_checkpoint, artifact, tmp_path, capsys):
    """`dllm-deploy bench` on the artifact with --reference: both runtimes over the same prompts
    and noise, identical canvases, the same decoder forwards, a JSON anyone can compare."""
    import json

    from dllm_deploy import cli
    out = tmp_path / "bench.json"
    assert cli.main(["bench", "--artifact", str(artifact), "--reference", str(tame_checkpoint), "--quick", "--steps", "3",
                     "--gen-length", "24", "--json-out", str(out)]) == 0
    res = json.loads(out.read_text())
    ref, ours = res["runs"]
    assert (ref["runtime"], ours["runtime"]) == ("transformers", "dllm-deploy")
    assert res["canvases_identical"] == "3/3" and ref["tokens"] == ours["tokens"] == 48
    assert ref["decoder_forwards"] == ours["decoder_forwards"] and res["speedup_vs_transformers"] > 0
    assert "dllm-deploy / transformers" in capsys.readouterr().out
