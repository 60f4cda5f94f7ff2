"""What ``dllm-deploy distill`` trains on (training/distill.py): the prompt sources (the bundled task
families, or a JSON-lines file) and the batches of partially masked answer states (block-causal
models: ``training/train.py``'s block-diffusion rows; bidirectional ones: semi-autoregressive
states, one active block per row; mask ratios leaning high, ``1 - u**2``)."""
from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

from ..errors import UserError
from ..models.registry import capabilities_of


# -- prompt sources ------------------------------------------------------------------------------

class TaskSource:
    """The bundled task families' ``train`` (or ``core``) distribution: prompts with reference
    answers and a scorer. Never yields a prompt of either evaluation split."""

    has_reference = True

    def __init__(self, mix: dict, seed: int, dist: str = "train"):
        from ..evals import tasks
        unknown = sorted(set(mix) - set(tasks.FAMILIES + tasks.OPEN_FAMILIES))
        if unknown:
            raise UserError(f"--mix: unknown family {unknown[0]!r} (known: {', '.join(tasks.FAMILIES + tasks.OPEN_FAMILIES)})")
        self.tasks, self.mix, self.rng = tasks, {k: v for k, v in mix.items() if v > 0}, random.Random(seed)
        if dist not in ("train", "core"):
            raise UserError(f"--dist: expected train or core, got {dist!r}")
        self.dist = dist
        self.held_out = tasks.eval_prompts()

    def draw(self):
        fams = list(self.mix)
        while True:
            fam = self.rng.choices(fams, weights=[self.mix[f] for f in fams])[0]
            ex = self.tasks.gen_text(self.rng, "train") if fam == "text" else self.tasks.GENERATORS[fam](self.rng, self.dist)
            if ex.prompt not in self.held_out:
                return ex

    def accept(self, ex, teacher_text: str) -> bool:
        """Whether the teacher's answer stands (open text: always)."""
        return ex.family in self.tasks.OPEN_FAMILIES or self.tasks.score(ex, teacher_text)


class FileSource:
    """A JSON-lines file of ``{"prompt": ...}`` (optionally ``"answer"``) records."""

    def __init__(self, path: Path, seed: int):
        recs = []
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise UserError(f"{path}: cannot read the prompts file ({e.strerror})") from None
        except UnicodeDecodeError:
            raise UserError(f"{path}: not UTF-8 text") from None
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                raise UserError(f"{path}:{i}: not a JSON object") from None
            if not isinstance(r, dict) or not isinstance(r.get("prompt"), str) or not r["prompt"]:
                raise UserError(f"{path}:{i}: expected an object with a non-empty string \"prompt\"")
            if "answer" in r and not isinstance(r["answer"], str):
                raise UserError(f"{path}:{i}: \"answer\" must be a string")
            recs.append(SimpleNamespace(family="file", prompt=r["prompt"], answer=r.get("answer")))
        if not recs:
            raise UserError(f"{path}: no prompts")
        self.recs, self.rng = recs, random.Random(seed)
        self.has_reference = all(r.answer is not None for r in recs)
        self._order: list = []

    def draw(self):
        if not self._order:
            self._order = list(self.recs)
            self.rng.shuffle(self._order)
        return self._order.pop()

    def accept(self, ex, teacher_text: str) -> bool:
        return ex.answer is None or teacher_text.rstrip() == ex.answer.rstrip()


# -- noise and rows ------------------------------------------------------------------------------

def _block_noise(block: int, mask_id: int, suffix_share: float):
    """A noise function for ``train.build_row_ids``: ``train.mask_blocks`` with mask ratios leaning
    high (``1 - u**2``)."""
    from . import train
    return lambda a, tok, rng: train.mask_blocks(a, mask_id, rng, block, suffix_share, lambda u: 1.0 - u * u)


def padded_answer(answer, eos: int, block: int) -> list[int]:
    """The answer, its EOS, and EOS up to a whole number of blocks (the rows' answer layout)."""
    a = list(answer) + [eos]
    return a + [eos] * (-len(a) % block)


def special_tokens(cfg) -> SimpleNamespace:
    """The special ids ``training/train.py``'s row builders take."""
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
    return SimpleNamespace(EOS=cfg.eos_token_id, MASK=cfg.mask_token_id, PAD=pad)


def _semi_ar_row(p: list[int], answer: list[int], eos: int, mask_id: int, block: int, rng: random.Random,
                 suffix_share: float):
    """A bidirectional model's state: blocks before an active one clean, the active block noised,
    later blocks masked (their positions are not in the loss: the runtime never commits them
    from such a state). Returns ids, positions, targets, loss flags."""
    a = padded_answer(answer, eos, block)
    n = rng.randrange(len(a) // block)
    noisy, lossf = _block_noise(block, mask_id, suffix_share)(a[n * block:(n + 1) * block], None, rng)
    ids = p + a[:n * block] + noisy + [mask_id] * (len(a) - (n + 1) * block)
    tgt = [0] * (len(p) + n * block) + a[n * block:(n + 1) * block] + [0] * (len(a) - (n + 1) * block)
    lf = [0] * (len(p) + n * block) + lossf + [0] * (len(a) - (n + 1) * block)
    return ids, list(range(len(ids))), tgt, lf


def _policy_noise(block_states: list, share: float, block: int, mask_id: int, base):
    """Noise for one answer: each block, with probability ``share`` and where states were recorded,
    one of the threshold rule's states of that block (True = masked), else ``base``."""
    def noise(a, tok, rng):
        noisy, lossf = [], []
        for b in range(len(a) // block):
            seg = a[b * block:(b + 1) * block]
            states = block_states[b] if b < len(block_states) else ()
            if states and rng.random() < share:
                m = rng.choice(states)
                noisy += [mask_id if x else t for x, t in zip(m, seg)]
                lossf += [int(x) for x in m]
            else:
                n, f = base(seg, tok, rng)
                noisy += n
                lossf += f
        return noisy, lossf
    return noise


def make_batch(rows, cfg, rng: random.Random, suffix_share: float, policy_share: float = 0.0):
    """(prompt ids, answer ids[, per-block policy states]) rows -> ids, positions, mask, targets,
    loss flags tensors."""
    import torch

    from . import train
    tok = special_tokens(cfg)
    if capabilities_of(cfg).block_causal:
        noise = _block_noise(cfg.block_size, cfg.mask_token_id, suffix_share)
        built = [train.build_row_ids(r[0], r[1], tok, rng, 1,
                                     _policy_noise(r[2], policy_share, cfg.block_size, cfg.mask_token_id, noise)
                                     if len(r) > 2 and r[2] else noise, block=cfg.block_size) for r in rows]
        return train.make_batch(rng, len(built), tok, set(), rows=built)
    built = [_semi_ar_row(r[0], r[1], cfg.eos_token_id, cfg.mask_token_id, cfg.block_size, rng, suffix_share) for r in rows]
    s = max(len(r[0]) for r in built)
    lens = torch.tensor([len(r[0]) for r in built])
    valid = torch.arange(s)[None] < lens[:, None]                              # (B,S) real positions
    mask = (valid[:, None, :] & valid[:, :, None]) | torch.eye(s, dtype=torch.bool)[None]

    def col(i, v):
        return torch.tensor([r[i] + [v] * (s - len(r[i])) for r in built], dtype=torch.long)
    return col(0, tok.PAD), col(1, 0), mask[:, None], col(2, 0), col(3, 0).bool()
