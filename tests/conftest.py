"""Shared fixtures: tiny random checkpoints in each supported layout, the bundled tiny model."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest

# pytest-xdist runs one worker per core: torch's OpenMP pool then takes one thread per worker (its
# default, a thread per core in every worker, spins against the other workers; the test models are
# far too small to gain from threads), and a pool of more threads (training's --threads 2, the
# subprocesses') sleeps instead of spinning while it waits: a spinning pool beside a busy worker
# burnt three times the CPU of the same work (the README's distill command: 23 against 8 CPU
# seconds). Set before torch loads, and inherited by the subprocesses.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# the five decode strategies every parity and progress check runs (SPD at W 4, chain tree)
STRATEGIES = {
    "vanilla": {"strategy": "vanilla"},
    "threshold": {"strategy": "threshold"},
    "spd-lossless-vanilla": {"strategy": "spd", "beam_width": 4},
    "spd-lossless-threshold": {"strategy": "spd", "base": "threshold", "beam_width": 4},
    "spd-select-threshold": {"strategy": "spd", "select": "threshold", "beam_width": 4},
}

LAYOUT_CONFIGS = {
    "llada": {"model_type": "llada", "d_model": 64, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2,
              "mlp_hidden_size": 96, "vocab_size": 300, "embedding_size": 300, "mask_token_id": 299,
              "eos_token_id": 298, "rope_theta": 500000.0, "max_sequence_length": 256, "weight_tying": False},
    "dream": {"model_type": "Dream", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 300, "mask_token_id": 299,
              "eos_token_id": 298, "pad_token_id": 297, "max_position_embeddings": 256, "tie_word_embeddings": False},
    "block_causal": {"model_type": "sdar", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 300, "mask_token_id": 299,
                     "eos_token_id": 298, "block_size": 8, "max_position_embeddings": 256, "head_dim": 16},
}

# mixture-of-experts layouts (tests/unit/models/test_moe.py, tests/integration/cpp/test_moe_decode.py): E 8, k 2
MOE_CONFIGS = {
    "sdar_moe": {"model_type": "sdar_moe", "architectures": ["SDARMoeForCausalLM"], "hidden_size": 64,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 96,
                 "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
                 "vocab_size": 300, "mask_token_id": 299, "eos_token_id": 298, "block_size": 4,
                 "max_position_embeddings": 256, "head_dim": 16, "rope_theta": 10000.0, "rms_norm_eps": 1e-6},
    # layer 0 dense; 4 groups of 2 experts, 2 groups kept; half of each head rotated
    "llada2": {"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"], "hidden_size": 64,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 3,
               "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
               "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
               "score_function": "sigmoid", "moe_router_enable_expert_bias": True, "norm_topk_prob": True,
               "routed_scaling_factor": 2.5, "partial_rotary_factor": 0.5, "rope_theta": 600000.0,
               "vocab_size": 300, "mask_token_id": 299, "eos_token_id": 298, "pad_token_id": 298, "block_size": 8,
               "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False},
    "llada_moe": {"model_type": "llada", "architectures": ["LLaDAMoEModelLM"], "hidden_size": 64,
                  "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
                  "expert_intermediate_size": 32, "dense_intermediate_size": 96, "num_experts": 8,
                  "num_experts_per_tok": 2, "qk_layernorm": True, "rope_theta": 50000.0, "vocab_size": 300,
                  "mask_token_id": 299, "eos_token_id": 298, "pad_token_id": 298, "max_position_embeddings": 256},
}


def write_checkpoint(folder: Path, layout: str, sharded: bool = False, seed: int = 0, config: dict | None = None) -> Path:
    """A tiny random checkpoint in the layout's own tensor names and config keys (``config``: keys
    that replace the layout's, e.g. a vocabulary for a tokenizer.json beside it)."""
    raw = {**LAYOUT_CONFIGS[layout], **(config or {})}
    return write_random_checkpoint(folder, raw, sharded=sharded, seed=seed)


def write_random_checkpoint(folder: Path, raw: dict, sharded: bool = False, seed: int = 0) -> Path:
    """A random checkpoint of the family ``raw`` (a config.json dict) names, in that family's own
    tensor names (its registry record's table); ``sharded``: two shards and an index."""
    import torch
    from safetensors.torch import save_file

    from dllm_deploy.models.config import DLLMConfig
    from dllm_deploy.models.registry import family_for

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    cfg, family = DLLMConfig.from_hf(raw), family_for(raw)
    torch.manual_seed(seed)
    model = family.build(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    tensors = {family.to_theirs(name): t.contiguous().clone() for name, t in model.state_dict().items()}
    if sharded:
        names = sorted(tensors)
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        weight_map = {}
        for fname, keys in shards.items():
            save_file({k: tensors[k] for k in keys}, str(folder / fname))
            weight_map.update({k: fname for k in keys})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        save_file(tensors, str(folder / "model.safetensors"))
    return folder


SELFSPEC = Path(__file__).resolve().parents[1] / "checkpoints" / "tiny-selfspec"   # the tri-mode tiny model


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock on the file ``path`` (created) for the block: one test process at a time
    (pytest-xdist workers share build/ and the run's temporary folder)."""
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def once_per_run(tmp_path_factory, name: str, build) -> tuple[Path, object]:
    """(folder, result) of ``build(folder)``, run once per test run: with pytest-xdist the first
    worker to ask builds it in the run's shared temporary folder while the others wait, then all read
    it (``result`` goes through JSON). Tests copy what they change; the folder is never edited."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                       # pytest-of-USER/pytest-N: shared by the run's workers
    folder, done = root / f"once-{name}", root / f"once-{name}.json"
    with locked(root / f"once-{name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)       # a build cut short by a failure
            folder.mkdir()
            done.write_text(json.dumps(build(folder)))
    return folder, json.loads(done.read_text())


@pytest.fixture(params=["llada", "dream", "block_causal"])
def layout_checkpoint(request, tmp_path):
    return request.param, write_checkpoint(tmp_path / request.param, request.param)


@pytest.fixture(scope="session")
def tiny_runtime():
    from dllm_deploy import Runtime
    return Runtime.load(model="tiny")


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory):
    from dllm_deploy.export.exporter import export
    folder, report = once_per_run(tmp_path_factory, "tiny", lambda d: export(
        "tiny", d / "tiny", precisions=["fp32", "int8", "int4"], max_beam_width=8, log=lambda m: None))
    return folder / "tiny", report


@pytest.fixture(scope="session")
def fp16_artifact(tmp_path_factory):
    """The bundled model exported once with fp16 and int8 variants (tiny_artifact's int8 options)."""
    from dllm_deploy.export.exporter import export
    folder, _ = once_per_run(tmp_path_factory, "tiny-fp16", lambda d: export(
        "tiny", d / "art", precisions=["fp32", "fp16", "int8"], max_beam_width=8, log=lambda m: None))
    return folder / "art"


@pytest.fixture(scope="session")
def selfspec_artifact(tmp_path_factory):
    """The committed tri-mode model (checkpoints/tiny-selfspec) exported once, fp32."""
    from dllm_deploy.export.exporter import export
    folder, _ = once_per_run(tmp_path_factory, "selfspec", lambda d: export(
        str(SELFSPEC), d / "art", log=lambda m: None))
    return folder / "art"


@pytest.fixture(scope="session")
def kv_io_pairs(tmp_path_factory, tiny_artifact, selfspec_artifact):
    """name -> (artifact of kv_io "append", the same model's of kv_io "new"), fp32: the bundled
    tiny model (block-causal), random LLaDA- and Dream-layout checkpoints (bidirectional; Dream's
    shifted logits) and the tri-mode self-speculative model. Exported once per run."""
    from dllm_deploy.export.exporter import export
    quiet = {"log": lambda m: None}

    def build(root: Path) -> dict:
        pairs = {}
        for name, src, append in (("tiny", "tiny", tiny_artifact[0]),
                                  ("selfspec", str(SELFSPEC), selfspec_artifact),
                                  ("llada", None, None), ("dream", None, None)):
            if src is None:
                src = str(write_checkpoint(root / f"{name}-ckpt", name))
                append = root / f"{name}-append"
                export(src, append, **quiet)
            export(src, root / f"{name}-new", kv_io="new", **quiet)
            pairs[name] = (str(append), str(root / f"{name}-new"))
        return pairs
    _, pairs = once_per_run(tmp_path_factory, "kv-io", build)
    return {name: (Path(a), Path(n)) for name, (a, n) in pairs.items()}


@pytest.fixture(scope="session")
def diffusion_gemma_export(tmp_path_factory):
    """A tame random DiffusionGemma checkpoint (tests/integration/models/test_diffusion_gemma.py) and its
    artifact, exported once: (checkpoint, artifact, export report)."""
    pytest.importorskip("transformers")
    from dllm_deploy.export.exporter import export
    from tests.integration.models.test_diffusion_gemma import _random_checkpoint

    def build(root: Path) -> dict:
        ckpt = _random_checkpoint(root / "ckpt", 0.1, 0.1)
        return {"checkpoint": str(ckpt), "report": export(ckpt, root / "art", log=lambda m: None)}
    root, out = once_per_run(tmp_path_factory, "diffusion-gemma", build)
    return Path(out["checkpoint"]), root / "art", out["report"]


def write_argmax_checkpoint(folder: Path, layout: str, token: str) -> Path:
    """A random checkpoint (write_checkpoint) whose top-1 id is a special token (``token``:
    "mask" or "pad") at every position, whatever the context: every embedding carries a large
    constant in dimension 0 (kept positive by the final norm), and only that token's LM-head row
    reads that dimension."""
    from safetensors.torch import load_file, save_file

    from dllm_deploy.models.config import DLLMConfig
    from dllm_deploy.models.registry import family_for

    write_checkpoint(folder, layout)
    cfg, family = DLLMConfig.from_hf(LAYOUT_CONFIGS[layout]), family_for(LAYOUT_CONFIGS[layout])
    embed, norm, head = (family.to_theirs(n) for n in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"))
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    tensors[embed][:, 0] = 20.0
    tensors[norm][0] = 1.0
    tensors[head][:, 0] = 0.0
    tensors[head][getattr(cfg, f"{token}_token_id"), 0] = 5.0
    save_file(tensors, str(path))
    return folder


# checkpoints whose raw top-1 is an id no decode step may emit: name -> (layout, token)
ARGMAX_CASES = {"llada-mask": ("llada", "mask"), "dream-pad": ("dream", "pad"), "block_causal-mask": ("block_causal", "mask")}


@pytest.fixture(scope="session")
def argmax_models(tmp_path_factory):
    """name -> (checkpoint, its artifact) for ARGMAX_CASES."""
    from dllm_deploy.export.exporter import export

    def build(root: Path) -> dict:
        out = {}
        for name, (layout, token) in ARGMAX_CASES.items():
            ckpt = write_argmax_checkpoint(root / f"{name}-ckpt", layout, token)
            out[name] = str(ckpt), export(ckpt, root / name, max_beam_width=4, log=lambda m: None)["artifact"]
        return out
    _, out = once_per_run(tmp_path_factory, "argmax", build)
    return {name: (Path(ckpt), art) for name, (ckpt, art) in out.items()}
