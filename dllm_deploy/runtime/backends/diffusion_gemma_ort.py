"""DiffusionGemma on ONNX Runtime: its exported ``encode`` / ``denoise`` graphs
(export/diffusion_gemma.py) behind runtime/uniform_diffusion.py's backend interface. No torch.

The KV cache is one array per layer and kind as the graphs return it (sliding layers: the last
W - 1 keys); the self-conditioning state is the ``soft_next`` the last step returned, (B,T,C),
so no (B,T,V) tensor reaches the host.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...errors import UserError, file_error
from ...models.masks import window_decoder_masks, window_encoder_masks
from .ort import session_threads

FORMAT = "diffusion_gemma/1"


class OrtDenoiser:
    kind = "uniform-diffusion"     # Runtime.kind: decoded by runtime/uniform_decoder.py
    name = "ort"
    sample_pool = None             # the rule samples over the whole vocabulary inside the graph

    def __init__(self, folder: str | Path, providers=None, threads: int | None = None):
        import onnxruntime as ort
        folder = Path(folder)
        try:
            self.manifest = json.loads((folder / "manifest.json").read_text())
        except OSError as e:
            raise file_error(folder / "manifest.json", e) from None
        except ValueError as e:
            raise UserError(f"{folder / 'manifest.json'}: not valid JSON ({e})") from None
        if self.manifest.get("format") != FORMAT:
            raise UserError(f"{folder}: not a DiffusionGemma artifact (format {self.manifest.get('format')!r}, "
                            f"expected {FORMAT!r})")
        m = self.manifest["model"]
        self.window, self.hidden = m["sliding_window"], m["hidden_size"]
        self.kv_shapes = list(zip(m["kv_heads"], m["head_dims"]))
        so = ort.SessionOptions()
        so.log_severity_level = 3
        session_threads(so, threads)
        graphs = self.manifest["graphs"]
        self.names = {r: graphs[r] for r in ("encode", "denoise")}
        self.folder = folder
        self.sessions = {r: ort.InferenceSession(str(folder / g["file"]), so,
                                                 providers=list(providers or ["CPUExecutionProvider"]))
                         for r, g in self.names.items()}
        self.providers = self.sessions["denoise"].get_providers()
        self.calls = {"encode": 0, "denoise": 0}

    def empty(self, batch: int) -> list:
        return [(np.zeros((batch, hkv, 0, d), np.float32),) * 2 for hkv, d in self.kv_shapes]

    def _past(self, role: str, past: list) -> dict:
        names = [n for n in self.names[role]["inputs"] if n.startswith("past_key_values.")]
        return dict(zip(names, (t for kv in past for t in kv)))

    def encode(self, ids, positions, keep, past: list) -> list:
        p, t = keep.shape[1] - ids.shape[1], ids.shape[1]
        masks = window_encoder_masks(keep, p, t, self.window)
        feeds = {"input_ids": ids, "position_ids": positions, "mask_full": np.ascontiguousarray(masks["full"]),
                 "mask_sliding": np.ascontiguousarray(masks["sliding"]), **self._past("encode", past)}
        out = self.sessions["encode"].run(None, feeds)
        self.calls["encode"] += 1
        return [(out[2 * i], out[2 * i + 1]) for i in range(len(out) // 2)]

    def denoise(self, canvas, positions, keep, past: list, state, temperature, u, frozen):
        b, t = canvas.shape
        masks = window_decoder_masks(keep, keep.shape[1], t, self.window)
        soft = np.zeros((b, t, self.hidden), np.float32) if state is None else state
        feeds = {"canvas_ids": canvas, "position_ids": positions, "mask_full": np.ascontiguousarray(masks["full"]),
                 "mask_sliding": np.ascontiguousarray(masks["sliding"]), "soft": soft, "temperature": temperature,
                 "sample_u": u, **self._past("denoise", past)}
        argmax, sampled, entropy, soft_next = self.sessions["denoise"].run(None, feeds)
        self.calls["denoise"] += 1
        if state is not None:
            soft_next = np.where(frozen[:, None, None], state, soft_next)
        return argmax, sampled, entropy, soft_next
