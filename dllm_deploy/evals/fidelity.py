"""How close a quantized variant's logits are to fp32's on the states a decode passes through.

Each state is a held-out prompt followed by one block: the first L tokens of the answer with a
random share of them masked (as the decode commits them), the rest masks. Both variants' prefill
graphs run the same states in ONNX Runtime; ``compare`` reports, over the block's positions, the
mean |logit difference|, how often the top-1 id agrees and the mean |difference| of the top-1
probability (what the threshold rule compares with tau).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import tasks


def decode_states(tokenizer, mask_id: int, block_length: int, n: int = 10, seed: int = 1) -> list[tuple]:
    """(ids (1,T), positions (1,T), mask (1,1,T,T), prompt length) for ``n`` held-out prompts per
    family; the prompt attends itself and the block attends everything (block-causal)."""
    rng = np.random.default_rng(seed)
    out = []
    for ex in tasks.eval_split(families=tasks.FAMILIES, n=n):
        p = tokenizer.encode(ex.prompt)
        block = np.full(block_length, mask_id, dtype=np.int64)
        ans = np.asarray(tokenizer.encode(ex.answer)[:block_length], dtype=np.int64)
        block[: ans.size] = np.where(rng.random(ans.size) < rng.random(), ans, mask_id)
        ids = np.asarray(p + block.tolist(), dtype=np.int64)[None]
        mask = np.ones((ids.shape[1], ids.shape[1]), dtype=bool)
        mask[: len(p), len(p):] = False                     # the prompt does not see the block
        mask = mask[None, None]
        out.append((ids, np.arange(ids.shape[1])[None], mask, len(p)))
    return out


def prefill_feeds(inputs, state) -> dict:
    """The prefill (or verify) graph's feeds (``inputs``: its session's get_inputs()) for one decode
    state: an empty cache (in the graph's KV type) and greedy sampling inputs."""
    ids, pos, mask, _ = state
    feeds = {"input_ids": ids, "position_ids": pos, "attention_mask": mask}
    for i in inputs[3:]:
        if i.name.startswith("past_key_values."):
            kv = np.float16 if i.type == "tensor(float16)" else np.float32
            feeds[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), kv)
        elif i.name == "sample_u":
            feeds[i.name] = np.zeros(ids.shape, np.float32)
        else:
            feeds[i.name] = {"top_k": np.zeros(1, np.int64), "top_p": np.ones(1, np.float32)}.get(
                i.name, np.zeros(1, np.float32))
    return feeds


def _block_logits(path: Path, states, threads: int = 1) -> list[np.ndarray]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return [s.run(["logits"], prefill_feeds(s.get_inputs(), st))[0][0, st[3]:] for st in states]


def _softmax_max(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e.max(-1) / e.sum(-1)


def compare(artifact: str | Path, precision: str, states) -> dict:
    """fp32 against ``precision`` of ``artifact`` on ``states`` (decode_states)."""
    from ..artifact import read_manifest
    m = read_manifest(artifact, verify=False)
    ref = _block_logits(Path(artifact) / m["precisions"]["fp32"]["prefill"], states)
    got = _block_logits(Path(artifact) / m["precisions"][precision]["prefill"], states)
    return compare_logits(ref, got)


def compare_logits(ref: list[np.ndarray], got: list[np.ndarray]) -> dict:
    """Fidelity of the block logits ``got`` to ``ref`` (one (L, V) array per decode state)."""
    err, agree, dp = [], [], []
    for a, b in zip(ref, got):
        finite = np.isfinite(a)                 # the excluded ids are -inf in both
        err.append(np.abs(np.subtract(a, b, out=np.zeros_like(a), where=finite)).sum() / finite.sum())
        agree.append(a.argmax(-1) == b.argmax(-1))
        dp.append(np.abs(_softmax_max(a) - _softmax_max(b)))
    return {"logit_error": float(np.mean(err)), "top1_agreement": float(np.mean(np.concatenate(agree))),
            "top1_prob_error": float(np.mean(np.concatenate(dp))), "states": len(ref),
            "positions": int(sum(len(x) for x in agree))}
