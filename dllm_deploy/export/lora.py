"""A draft-only LoRA adapter (Nemotron-Labs-Diffusion's ``linear_spec_lora/``): PEFT's files,
folded into the weights of the graph that drafts, never into the verifier's.

NVIDIA ships the adapter beside the checkpoint (PEFT format, ``target_modules: [o_proj]``, r 128,
alpha 512) and turns it on for the bidirectional draft only, so the causal verifier stays the base
model and the output its autoregressive output (docs/self_speculation.md). Folded, a target
weight W of the draft becomes W + scale * B @ A (scale = alpha / r, or alpha / sqrt(r) with
rsLoRA), read tensor by tensor as the export streams the weights.

    adapter = read_adapter(checkpoint_folder, family)     # None when the folder has none
    source.with_deltas(adapter.deltas)                    # export/streamed.py
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError, file_error

FOLDER = "linear_spec_lora"          # the adapter's folder inside the checkpoint's
PREFIX = "base_model.model."         # PEFT's prefix of the adapted model's module names


@dataclass
class Adapter:
    folder: Path
    r: int
    alpha: float
    scale: float
    targets: list
    deltas: dict = field(default_factory=dict)    # our parameter name -> (file, A's name, B's name, scale)

    def record(self) -> dict:
        """What the manifest keeps of it."""
        return {"folder": FOLDER, "r": self.r, "alpha": self.alpha, "scale": self.scale,
                "target_modules": self.targets, "weights": len(self.deltas), "graph": "verify"}


def read_adapter(src: Path, family, shapes: dict) -> Adapter | None:
    """The draft adapter under ``src/linear_spec_lora`` (None when there is none), its tensors
    mapped onto the module's parameter names (``shapes``: name -> shape) and checked."""
    folder = Path(src) / FOLDER
    cfg_path = folder / "adapter_config.json"
    if not cfg_path.exists():
        return None
    try:
        cfg = json.loads(cfg_path.read_text())
    except OSError as e:
        raise file_error(cfg_path, e) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{cfg_path}: not valid JSON ({e})") from None
    for key, ok in (("use_dora", False), ("fan_in_fan_out", False), ("bias", "none")):
        if cfg.get(key, ok) != ok:
            raise UserError(f"{cfg_path}: {key} {cfg[key]!r} is not supported (a plain LoRA: {key} {ok!r})")
    try:
        r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{cfg_path}: needs r and lora_alpha") from None
    if r < 1:
        raise UserError(f"{cfg_path}: r must be >= 1, got {r}")
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    targets = cfg.get("target_modules") or []
    adapter = Adapter(folder, r, alpha, scale, list(targets) if isinstance(targets, list) else [targets])
    _map_tensors(adapter, family, shapes)
    return adapter


def _map_tensors(adapter: Adapter, family, shapes: dict) -> None:
    from safetensors import safe_open
    path = adapter.folder / "adapter_model.safetensors"
    if not path.exists():
        raise UserError(f"{adapter.folder}: no adapter_model.safetensors (the adapter's weights)")
    pairs: dict[str, dict] = {}
    try:
        with safe_open(str(path), framework="pt") as st:
            for name in st.keys():
                for part in ("A", "B"):
                    tail = f".lora_{part}.weight"
                    if name.startswith(PREFIX) and name.endswith(tail):
                        theirs = name[len(PREFIX):-len(tail)] + ".weight"
                        pairs.setdefault(theirs, {})[part] = (name, tuple(st.get_slice(name).get_shape()))
    except OSError as e:
        raise file_error(path, e) from None
    except Exception as e:      # safetensors reports a corrupt header as several exception types
        raise UserError(f"{path}: corrupt safetensors file ({e})") from None
    for theirs, ab in sorted(pairs.items()):
        ours = family.to_ours(theirs)
        if ours not in shapes or set(ab) != {"A", "B"}:
            raise UserError(f"{path}: {theirs} is not a weight of the model, or lacks lora_A / lora_B")
        (a_name, a_shape), (b_name, b_shape) = ab["A"], ab["B"]
        if a_shape != (adapter.r, shapes[ours][1]) or b_shape != (shapes[ours][0], adapter.r):
            raise UserError(f"{path}: {theirs}: lora_A {a_shape} / lora_B {b_shape} do not fit the weight "
                            f"{shapes[ours]} at r {adapter.r}")
        adapter.deltas[ours] = (path, a_name, b_name, adapter.scale)
    if not adapter.deltas:
        raise UserError(f"{path}: no LoRA weights (lora_A / lora_B pairs under {PREFIX!r})")


def delta(entry) -> "torch.Tensor":  # noqa: F821
    """scale * B @ A of one target weight (float32)."""
    from safetensors import safe_open
    path, a_name, b_name, scale = entry
    with safe_open(str(path), framework="pt") as st:
        a, b = st.get_tensor(a_name).float(), st.get_tensor(b_name).float()
    return (b @ a) * scale
