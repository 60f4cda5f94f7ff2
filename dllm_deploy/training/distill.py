"""Certainty-forcing self-distillation: ``dllm-deploy distill`` (docs/distill.md).

A teacher (the model itself, or another checkpoint) decodes prompts with the quality rule
(vanilla, one token per step). The student, initialised from the model, learns on partially masked
states of those answers, as the runtime sees them, to

- predict the teacher's tokens: cross-entropy on every masked position, and
- be certain where it is right: the entropy of its temperature-scaled distribution on the masked
  positions it already predicts correctly (dParallel's certainty forcing, arXiv 2509.26488),

so that threshold decoding commits many positions per step without changing the answer.

Where the prompts come with reference answers (the bundled task families), a teacher answer the
reference contradicts is replaced by the reference ("verified" distillation), and a share of every
batch is fresh reference examples: that is how a small model learns inputs its teacher cannot
answer (the generalization split).

States. Block-causal models train on the vectorised block-diffusion rows of ``training/train.py``
(prompt, clean blocks, noisy copies of every block); bidirectional ones (LLaDA, Dream) on
semi-autoregressive states (blocks before an active one clean, the active block partly masked, the
rest masked), one active block per row. Mask ratios lean high (``1 - u**2``), because the first
steps of a block, where most positions are masked, are where parallel decoding commits or fails.
"""
from __future__ import annotations

import json
import math
import os
import random
import resource
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..artifact.fsio import clean_stale, lock_target, remove_temp_dir, replace_dir, temp_dir
from ..errors import UserError
from ..models.registry import capabilities_of
from .distill_data import FileSource, TaskSource, make_batch, padded_answer, special_tokens

RECORD = "training.json"      # the training record every checkpoint of ours carries
LOG = "train_log.jsonl"


@dataclass
class DistillConfig:
    steps: int = 6000
    batch: int = 8
    lr: float = 3e-4
    warmup: int = 60
    seed: int = 0
    entropy_weight: float = 0.5           # beta: weight of the certainty term
    entropy_temperature: float = 1.0      # T: the entropy is of softmax(logits / T)
    teacher_prompts: int = 256            # prompts the teacher decodes (the distillation set)
    reference_share: float = 0.5          # share of each batch drawn fresh from a reference source
    suffix_share: float = 0.25            # share of blocks noised by suffix masking (left-to-right states)
    gen_length: int = 128                 # the teacher's canvas
    threads: int = 2
    time_limit: float = 0.0               # seconds; 0: none
    dist: str = "train"                   # bundled tasks: "train" (core + broad inputs) or "core"
    policy_share: float = 0.0             # share of teacher-answer blocks noised as the threshold rule's own states
    policy_tau: float = 0.9               # the threshold rule whose states those are
    policy_every: int = 250               # steps between recomputing those states with the current student
    policy_pool: int = 0                  # >0: the states are of this many fresh reference answers, redrawn each time
    mix: dict = field(default_factory=lambda: {"upper": 1.2, "reverse": 2.0, "kv": 1.0, "csv": 1.0,
                                               "count": 2.0, "letter": 1.0, "text": 0.3})


def policy_states(student, cfg, rows, tau: float, batch: int = 16) -> tuple[list, dict]:
    """The states the threshold rule (``tau``) passes through when the student decodes each row's
    answer with the right token written wherever the rule commits (teacher forcing): per row, per
    answer block, the masked positions before each step (tuples of bools). A block-causal model's
    block sees only the clean blocks before it, so every block of a row advances in the same
    forward of the vectorised block-diffusion row. Also returns counts: ``commits``, ``wrong``
    (commits where the student's top-1 was not the answer's token), ``block_steps``, and from them
    ``wrong_share`` and ``tokens_per_step``."""
    import numpy as np
    import torch

    from . import train
    from ..runtime.rules import Threshold
    rule, L, mask_id, tok = Threshold(tau), cfg.block_size, cfg.mask_token_id, special_tokens(cfg)
    out, commits, wrong, block_steps = [], 0, 0, 0
    for i in range(0, len(rows), batch):
        chunk = rows[i:i + batch]
        answers = [np.array(padded_answer(a, tok.EOS, L)) for _, a in chunk]
        cur = [np.full(len(a), mask_id) for a in answers]
        states = [[[] for _ in range(len(a) // L)] for a in answers]
        for step in range(L):
            active = [k for k in range(len(chunk)) if (cur[k] == mask_id).any()]
            if not active:
                break
            built = [train.build_row_ids(chunk[k][0], chunk[k][1], tok, None, 1, block=L,
                                         noise=lambda a, t, r, s=cur[k]: (s.tolist(), [0] * len(s))) for k in active]
            ids, pos, mask, _, _ = train.make_batch(None, len(built), tok, set(), rows=built)
            with torch.no_grad():
                conf, top = torch.softmax(student(ids, pos, mask)[0].float(), -1).max(-1)
            for j, k in enumerate(active):
                a, start = answers[k], len(built[j][0]) - len(answers[k])     # the noisy copy ends the row
                c, t = conf[j, start:start + len(a)].numpy(), top[j, start:start + len(a)].numpy()
                for b in range(len(a) // L):
                    sl = slice(b * L, (b + 1) * L)
                    st = cur[k][sl]
                    if not (st == mask_id).any():
                        continue
                    states[k][b].append(tuple(bool(x) for x in st == mask_id))
                    hit = rule.positions(st, c[sl], step, mask_id)
                    commits += len(hit)
                    wrong += int((t[sl][hit] != a[sl][hit]).sum())
                    block_steps += 1
                    st[hit] = a[sl][hit]
        out.extend(states)
    return out, {"commits": commits, "wrong": wrong, "block_steps": block_steps,
                 "wrong_share": round(wrong / max(1, commits), 4), "tokens_per_step": round(commits / max(1, block_steps), 3)}


def certainty_loss(logits, targets, temperature: float):
    """Mean entropy of softmax(logits / T) over the rows whose top-1 is the target (0 when none)."""
    import torch
    right = logits.argmax(-1) == targets
    if not bool(right.any()):
        return logits.sum() * 0.0
    logp = torch.log_softmax(logits[right] / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1).mean()


# -- the teacher ---------------------------------------------------------------------------------

def teacher_set(teacher: str | Path, tokenizer, source, n: int, gen_length: int, progress=None) -> tuple[list, dict]:
    """The teacher decodes n prompts with vanilla (one token per step). Returns
    [(prompt ids, answer ids)] and counts; with references, a contradicted answer is replaced."""
    from ..runtime.api import Runtime
    rt = Runtime.load(model=str(teacher))
    examples = [source.draw() for _ in range(n)]
    rows, kept, replaced, forwards = [], 0, 0, 0
    t0 = time.perf_counter()
    for i in range(0, n, 16):
        chunk = examples[i:i + 16]
        results = rt.generate([e.prompt for e in chunk], strategy="vanilla", gen_length=gen_length)
        for e, r in zip(chunk, results):
            forwards += r.forwards
            ids = [t for t in r.token_ids if t != rt.config.eos_token_id]
            if source.accept(e, r.text):
                kept += 1
            else:
                ids, replaced = tokenizer.encode(e.answer), replaced + 1
            rows.append((tokenizer.encode(e.prompt), ids))
        if progress:
            progress(len(chunk))
    return rows, {"teacher_decoded": n, "teacher_kept": kept, "replaced_by_reference": replaced, "teacher_forwards": forwards,
                  "teacher_s": round(time.perf_counter() - t0, 1)}


# -- the command ---------------------------------------------------------------------------------

def check_target(out: Path, src: Path, force: bool) -> None:
    """``out`` may be new, or (with ``force``) a checkpoint this command wrote; never the source."""
    if out.resolve() == src.resolve():
        raise UserError(f"{out}: is the model being distilled; write the student to another folder")
    if not os.path.lexists(out):
        if not out.parent.is_dir():
            raise UserError(f"{out.parent}: no such folder")
        return
    if not force:
        raise UserError(f"{out}: already exists (pass --force to replace a checkpoint written by dllm-deploy distill)")
    try:
        ours = "distill" in json.loads((out / RECORD).read_text())
    except (OSError, ValueError, TypeError):
        ours = False
    if out.is_symlink() or not out.is_dir() or not ours:
        raise UserError(f"{out}: not a checkpoint written by dllm-deploy distill (no {RECORD} of ours); "
                        "--force replaces only those, so move or delete it yourself")


def _write_checkpoint(model, src: Path, work: Path, record: dict, log_lines: list[str]) -> None:
    """The student in the source's layout: the source's files (config, tokenizer) copied, the
    weights written under the source's own tensor names, the record and the log beside them."""
    from safetensors.torch import save_file

    from ..models.loading import read_tensors
    from ..models.registry import get_family
    ours = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    family = get_family(model.config.layout)
    out_tensors = {}
    for name, t in read_tensors(src).items():
        mapped = family.to_ours(name)
        out_tensors[name] = ours[mapped].to(t.dtype) if mapped in ours else t
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in (RECORD, LOG, "model.safetensors.index.json"):
            shutil.copy2(f, work / f.name)
    save_file(out_tensors, str(work / "model.safetensors"), metadata={"format": "pt"})
    previous = src / LOG
    text = previous.read_text() if previous.exists() else ""
    (work / LOG).write_text(text + "".join(line + "\n" for line in log_lines))
    (work / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def distill(model: str, out: str | Path, teacher: str | None = None, prompts: str | None = None,
            dcfg: DistillConfig | None = None, force: bool = False, log=print, progress=None) -> dict:
    """Distil ``model`` into the checkpoint folder ``out``; returns the training record."""
    import torch
    import torch.nn.functional as F

    from ..models.loading import load_model, resolve_model_dir
    from ..models.tokenizer import load_tokenizer
    c = dcfg or DistillConfig()
    if c.steps < 1 or c.batch < 1 or c.teacher_prompts < 0 or not 0 <= c.reference_share <= 1 or c.lr <= 0:
        raise UserError("--steps, --batch must be >= 1, --teacher-prompts >= 0, --lr > 0, --reference-share in [0, 1]")
    if not 0 <= c.policy_share <= 1 or not 0 < c.policy_tau <= 1 or c.policy_every < 1 or c.policy_pool < 0:
        raise UserError("--policy-share must be in [0, 1], --policy-tau in (0, 1], --policy-every >= 1, --policy-pool >= 0")
    if c.policy_pool and not c.policy_share:
        raise UserError("--policy-pool: set --policy-share too (the share of the pool's blocks noised as the rule's states)")
    src = resolve_model_dir(model)
    tsrc = resolve_model_dir(teacher) if teacher else src
    out = Path(out)
    check_target(out, src, force)
    torch.manual_seed(c.seed)
    torch.set_num_threads(c.threads)
    rng = random.Random(c.seed)
    student, cfg = load_model(src)
    tokenizer = load_tokenizer(src, cfg.eos_token_id)
    if c.policy_share > 0 and not capabilities_of(cfg).block_causal:
        raise UserError("--policy-share: the threshold rule's states are built for block-causal models "
                        f"(this checkpoint is {cfg.attention})")
    source = FileSource(Path(prompts), c.seed) if prompts else TaskSource(c.mix, c.seed, c.dist)
    if not source.has_reference and c.teacher_prompts == 0:
        raise UserError("the prompts have no reference answers: the teacher must decode some (--teacher-prompts > 0)")
    if c.policy_pool and not source.has_reference:
        raise UserError("--policy-pool: the prompts have no reference answers (every record needs an \"answer\")")
    share = c.reference_share if source.has_reference else 0.0
    if c.teacher_prompts == 0:
        share = 1.0
    cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    log_lines: list[str] = []

    log(f"teacher {tsrc}: decoding {c.teacher_prompts} prompts (vanilla, one token per step)")
    teacher_rows, tstats = (teacher_set(tsrc, tokenizer, source, c.teacher_prompts, c.gen_length, progress and progress("teacher", c.teacher_prompts))
                            if c.teacher_prompts else ([], {"teacher_decoded": 0}))
    log(f"teacher: {tstats.get('teacher_kept', 0)} answers kept, {tstats.get('replaced_by_reference', 0)} replaced by the reference")

    student.set_attention("sdpa")
    # the rows whose threshold-rule states are recorded: the teacher's answers, or (--policy-pool)
    # fresh reference answers, redrawn at every refresh so that no answer is seen often enough to learn
    tracked = [] if c.policy_pool else teacher_rows
    recording = c.policy_share > 0 and bool(teacher_rows or c.policy_pool)
    policy: list = [[] for _ in tracked]
    pstats: list[dict] = []

    def fresh_row() -> tuple:
        ex = source.draw()
        return tokenizer.encode(ex.prompt), tokenizer.encode(ex.answer)

    def refresh(step: int) -> None:
        nonlocal policy, tracked
        student.eval()
        if c.policy_pool:
            tracked = [fresh_row() for _ in range(c.policy_pool)]
        policy, st = policy_states(student, cfg, tracked, c.policy_tau)
        student.train()
        st = {"phase": "policy", "step": step, "tau": c.policy_tau, "rows": len(tracked),
              "fresh": bool(c.policy_pool), **st}
        pstats.append(st)
        log_lines.append(json.dumps(st))
        log(f"threshold-rule states (tau {c.policy_tau}, {len(tracked)} {'fresh reference' if c.policy_pool else 'teacher'} "
            f"answers): {st['wrong_share']:.1%} of commits wrong, {st['tokens_per_step']:.2f} tokens per block step")

    student.train()
    opt = torch.optim.AdamW(student.parameters(), lr=c.lr, betas=(0.9, 0.98), weight_decay=0.01)
    ema_ce = ema_h = None
    bar = progress and progress("distill", c.steps)
    step = 0
    t_train = time.time()
    timed_out = False
    for step in range(1, c.steps + 1):
        # cosine to a tenth over the steps, or over the time limit when that comes first
        done = max(step / c.steps, (time.time() - t_train) / c.time_limit if c.time_limit else 0.0)
        lr = c.lr * min(1.0, step / c.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))
        for g in opt.param_groups:
            g["lr"] = lr
        if recording and (step - 1) % c.policy_every == 0:
            refresh(step - 1)
        rows = []
        for _ in range(c.batch):
            if teacher_rows and rng.random() >= share:
                k = rng.randrange(len(teacher_rows))
                rows.append((*teacher_rows[k], () if c.policy_pool else policy[k]))
            elif c.policy_pool:
                k = rng.randrange(len(tracked))
                rows.append((*tracked[k], policy[k]))
            else:
                rows.append(fresh_row())
        rows.sort(key=lambda r: len(r[0]) + len(r[1]))
        ids, pos, mask, tgt, lf = make_batch(rows, cfg, rng, c.suffix_share, c.policy_share)
        logits, _ = student(ids, pos, mask)
        z, y = logits[lf], tgt[lf]
        ce = F.cross_entropy(z, y)
        h = certainty_loss(z, y, c.entropy_temperature)
        loss = ce + c.entropy_weight * h
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        ema_ce = ce.item() if ema_ce is None else 0.98 * ema_ce + 0.02 * ce.item()
        ema_h = h.item() if ema_h is None else 0.98 * ema_h + 0.02 * h.item()
        if step % 25 == 0 or step == 1:
            with torch.no_grad():
                acc = (z.argmax(-1) == y).float().mean().item()
            log_lines.append(json.dumps({"phase": "distill", "step": step, "ce": round(ce.item(), 4), "entropy": round(h.item(), 4),
                                         "ce_ema": round(ema_ce, 4), "entropy_ema": round(ema_h, 4), "masked_acc": round(acc, 4),
                                         "lr": round(lr, 7), "elapsed_s": round(time.time() - t0, 1)}))
            if step % 100 == 0 and not bar:
                log(log_lines[-1])
        if bar:
            bar(1)
        if c.time_limit and time.time() - t_train >= c.time_limit:
            timed_out = True
            break
    if recording:
        refresh(step)
    student.eval()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    record = {
        "distill": {**asdict(c), "steps_done": step, "stopped_by_time_limit": timed_out,
                    "model": str(model), "teacher": str(teacher or model), "prompts": str(prompts) if prompts else f"tasks:{c.dist}",
                    "states": cfg.attention, "wall_s": round(time.time() - t0, 1),
                    "cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
                    "final_ce_ema": round(ema_ce, 4), "final_entropy_ema": round(ema_h, 4),
                    "torch": torch.__version__, **tstats,
                    **({"policy_first": pstats[0], "policy_last": pstats[-1]} if pstats else {})},
        "previous": _read_record(src),
    }
    with lock_target(out):
        check_target(out, src, force)
        clean_stale(out)
        scratch = temp_dir(out)
        try:
            work = scratch / "new"
            work.mkdir()
            _write_checkpoint(student, src, work, record, log_lines)
            replace_dir(work, out, scratch)
        finally:
            remove_temp_dir(scratch)
    log(f"wrote {out} ({step} steps, {record['distill']['wall_s']:.0f} s)")
    return record


def _read_record(folder: Path):
    try:
        return json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
