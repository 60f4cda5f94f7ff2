"""Load a dLLM from a local Hugging Face folder: ``config.json`` + ``*.safetensors``.

Single-file checkpoints and sharded ones (``model.safetensors.index.json``) are read; the
family's name table (models/registry.py) maps the checkpoint's tensor names onto its module's.
Errors name the file, the tensor and what was expected.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError, file_error
from .config import DLLMConfig
from .registry import get_family

TINY_DIR = Path(__file__).resolve().parent / "tiny"

def _shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_bytes().decode("utf-8"))["weight_map"]
        except OSError as e:
            raise file_error(index, e) from None
        except (ValueError, KeyError, TypeError, RecursionError):     # JSON, UTF-8 and shape errors
            weight_map = None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) and f and "\0" not in f for f in weight_map.values()):
            raise UserError(f"{index}: not a valid safetensors index (needs a 'weight_map' object of file names)")
        files = sorted({folder / f for f in weight_map.values()})
        for f in files:
            if not f.exists():
                raise UserError(f"{index}: shard {f.name} is missing")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserError(f"{folder}: no *.safetensors weights")
    return files


def open_shards(folder: Path):
    """(file, open safetensors handle) of each shard of the checkpoint in turn (the handle is
    closed, and its mapping released, when the next is yielded); unreadable files are UserErrors."""
    from safetensors import SafetensorError, safe_open
    for f in _shard_files(folder):
        try:
            with open(f, "rb"):     # the library reports an unreadable file as a missing one
                pass
            with safe_open(str(f), framework="pt") as st:
                yield f, st
        except OSError as e:
            raise file_error(f, e) from None
        except (SafetensorError, ValueError) as e:
            raise UserError(f"{f}: corrupt safetensors file ({e})") from None


def iter_tensors(folder: Path, wanted=None):
    """(checkpoint name, torch tensor) of the checkpoint, read one tensor at a time (a tensor is
    resident only while the caller holds it); ``wanted(name) -> bool`` skips the others unread."""
    for _, st in open_shards(folder):
        for name in st.keys():
            if wanted is None or wanted(name):
                yield name, st.get_tensor(name)


def read_tensors(folder: Path) -> dict:
    """All tensors of the checkpoint as torch tensors, by checkpoint name."""
    return dict(iter_tensors(folder))


def resolve_model_dir(model: str | Path) -> Path:
    if str(model) == "tiny":
        if not (TINY_DIR / "model.safetensors").exists():
            raise UserError(f"the bundled tiny model is missing from {TINY_DIR}")
        return TINY_DIR
    folder = Path(model)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such model folder (expected config.json + *.safetensors, or 'tiny')")
    return folder


def load_model(model: str | Path, dtype=None, attention: str = "sdpa"):
    """Build the module from the folder's config.json and load its weights. Returns (module, config)."""
    import torch

    folder = resolve_model_dir(model)
    cfg = DLLMConfig.from_file(folder / "config.json")
    family = get_family(cfg.layout)
    with torch.device("meta"):
        module = family.build(cfg)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    tensors = {}
    # one tensor at a time: a bf16 / fp16 checkpoint is never resident beside its fp32 copy
    for name, t in iter_tensors(folder, lambda n: family.to_ours(n) in expected):
        ours = family.to_ours(name)
        if tuple(t.shape) != expected[ours]:
            raise UserError(f"{folder}: tensor {name} has shape {tuple(t.shape)}, expected {expected[ours]}")
        tensors[ours] = t.float()          # the module's dtype
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise UserError(f"{folder}: missing tensor {missing[0]} ({len(missing)} missing in all)")
    module = module.to_empty(device="cpu")
    # assign: the parameters become the tensors just read (the empty ones were never touched, so
    # never resident): one copy of the weights in memory, not two
    module.load_state_dict(tensors, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        module.lm_head.weight = module.model.embed_tokens.weight
    module.eval().set_attention(attention)
    if dtype is not None:
        module = module.to(dtype)
    return module, cfg
