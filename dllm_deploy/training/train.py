"""Train the bundled tiny dLLM: block-causal masked diffusion, block length 32, byte vocabulary.

    dllm-deploy train --out dllm_deploy/models/tiny --seed 0

Objective (BD3-LM / SDAR style, vectorised): each training row is
``[prompt | clean answer blocks | noisy answer blocks]``. Block b of the answer is noised by
masking each token with probability t ~ U(0,1) (at least one token). A noisy block attends to the
prompt, the clean blocks before it and itself (bidirectionally); a clean block attends to the
prompt and the clean blocks up to itself; the prompt attends to itself. This is exactly what the
runtime sees at decode time (prefilled prompt, committed blocks in the KV cache, one block being
denoised), so every answer token gets a loss in one forward. Loss: cross-entropy on masked
positions only. The answer is followed by EOS and padded with EOS to a whole block.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import UserError
from ..evals import tasks
from ..models.config import DLLMConfig
from ..models.tokenizer import ByteTokenizer
from ..models.transformer import DLLM
from .flags import COPIES, SUFFIX_SHARE, add_train_arguments

BLOCK = 32
MIX = {"upper": 1.0, "reverse": 1.5, "kv": 1.5, "csv": 1.0, "count": 1.5, "letter": 0.7, "text": 0.8}
MAX_ANSWER = 0  # curriculum: only answers of at most this many bytes (0: all)
DIST = "core"   # the task families' distribution (evals/tasks.py): core, or train (half broad inputs)
AR_MIN_STEPS = 100  # --ar-until-loss looks at the warm-up's loss average only after this many steps
KIND_PROMPT, KIND_CLEAN, KIND_NOISY, KIND_PAD = 0, 1, 2, 3


def tiny_config(hidden: int = 256, layers: int = 6, heads: int = 8, kv_heads: int = 4, ffn: int = 704) -> DLLMConfig:
    tok = ByteTokenizer()
    return DLLMConfig(
        layout="block_causal", model_type="dllm_block", vocab_size=tok.vocab_size, hidden_size=hidden,
        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, intermediate_size=ffn,
        mask_token_id=tok.MASK, eos_token_id=tok.EOS, pad_token_id=tok.PAD, rope_theta=10000.0,
        rms_norm_eps=1e-6, max_seq=512, block_size=BLOCK, attention="block_causal",
        tie_word_embeddings=False,
    )


def hf_config_dict(cfg: DLLMConfig) -> dict:
    """The config.json written next to the weights (Qwen2-style keys + block_size)."""
    return {
        "model_type": cfg.model_type, "architectures": ["DLLMForBlockDiffusion"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "intermediate_size": cfg.intermediate_size,
        "head_dim": cfg.head_dim, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_seq, "block_size": cfg.block_size,
        "qkv_bias": cfg.qkv_bias, "qk_norm": cfg.qk_norm, "tie_word_embeddings": cfg.tie_word_embeddings,
        "mask_token_id": cfg.mask_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
        "tokenizer": "byte",
    }


def sample_example(rng: random.Random, held_out: set[str], mix: dict[str, float] | None = None) -> tasks.Example:
    mix = mix or MIX
    fams = list(mix)
    while True:
        fam = rng.choices(fams, weights=[mix[f] for f in fams])[0]
        ex = tasks.gen_text(rng, "train") if fam == "text" else tasks.GENERATORS[fam](rng, DIST)
        if ex.prompt not in held_out and (not MAX_ANSWER or len(ex.answer) <= MAX_ANSWER):
            return ex


def mask_blocks(a: list[int], mask_id: int, rng: random.Random, block: int = BLOCK, suffix_share: float | None = None,
                ratio=lambda u: u) -> tuple[list[int], list[int]]:
    """One noisy copy of the answer blocks and its loss flags (1 = masked): per block, suffix
    masking (share ``suffix_share``, default SUFFIX_SHARE), else each token masked with probability
    ``ratio(u)``, u ~ U(0,1) (at least one token)."""
    share = SUFFIX_SHARE if suffix_share is None else suffix_share
    noisy = list(a)
    lossf = [0] * len(a)
    for b in range(len(a) // block):
        idx = range(b * block, (b + 1) * block)
        if rng.random() < share:
            # suffix masking: everything from a random cut on, plus a few holes before it -- the
            # states a confident left-to-right decode passes through
            cut = b * block + rng.randrange(block)
            hit = [i for i in idx if i >= cut or rng.random() < 0.1]
        else:
            t = ratio(rng.random())
            hit = [i for i in idx if rng.random() < t] or [rng.choice(list(idx))]
        for i in hit:
            noisy[i] = mask_id
            lossf[i] = 1
    return noisy, lossf


def noise_answer(a: list[int], tok: ByteTokenizer, rng: random.Random) -> tuple[list[int], list[int]]:
    """The training noise (``mask_blocks`` with the module's block and suffix share)."""
    return mask_blocks(a, tok.MASK, rng)


def build_row(ex: tasks.Example, tok: ByteTokenizer, rng: random.Random, copies: int = 1, noise=None):
    """Token ids, positions, kinds, block ids, copy ids, targets and loss flags for one row.

    ``copies`` independent noisy copies of the answer share the prompt and the clean blocks
    (each copy attends only to itself): more masked positions per forward for little extra cost.
    ``noise(answer, tok, rng) -> (noisy, loss flags)`` replaces the training noise (probes)."""
    return build_row_ids(tok.encode(ex.prompt), tok.encode(ex.answer), tok, rng, copies, noise)


def build_row_ids(p: list[int], answer: list[int], tok, rng: random.Random, copies: int = 1, noise=None,
                  block: int = BLOCK):
    """``build_row`` on token ids: prompt ids ``p``, answer ids without EOS; ``tok`` gives ``EOS``
    and ``MASK`` (the noise's mask id)."""
    a = list(answer) + [tok.EOS]
    a += [tok.EOS] * (-len(a) % block)
    c = len(a) - block  # the last block's clean copy is context for nothing: leave it out
    ids, kind = p + a[:c], [KIND_PROMPT] * len(p) + [KIND_CLEAN] * c
    pos = list(range(len(p))) + list(range(len(p), len(p) + c))
    blk = [-1] * len(p) + [i // block for i in range(c)]
    rep = [0] * (len(p) + c)
    tgt, lf = [0] * (len(p) + c), [0] * (len(p) + c)
    for r in range(copies):
        noisy, lossf = (noise or noise_answer)(a, tok, rng)
        ids += noisy
        pos += list(range(len(p), len(p) + len(a)))
        kind += [KIND_NOISY] * len(a)
        blk += [i // block for i in range(len(a))]
        rep += [r] * len(a)
        tgt += a
        lf += lossf
    return ids, pos, kind, blk, rep, tgt, lf, p + a[:a.index(tok.EOS) + 1], len(p)


def training_mask(kind: torch.Tensor, blk: torch.Tensor, rep: torch.Tensor | None = None) -> torch.Tensor:
    """(B,S) kinds, block ids and noisy-copy ids -> (B,1,S,S) bool attention mask of the
    vectorised objective."""
    qk, kk = kind[:, :, None], kind[:, None, :]
    qb, kb = blk[:, :, None], blk[:, None, :]
    same_copy = True if rep is None else rep[:, :, None] == rep[:, None, :]
    key_prompt = kk == KIND_PROMPT
    m_prompt = (qk == KIND_PROMPT) & key_prompt
    m_clean = (qk == KIND_CLEAN) & (key_prompt | ((kk == KIND_CLEAN) & (kb <= qb)))
    m_noisy = (qk == KIND_NOISY) & (key_prompt | ((kk == KIND_CLEAN) & (kb < qb)) | ((kk == KIND_NOISY) & (kb == qb) & same_copy))
    s = kind.shape[1]
    eye = torch.eye(s, dtype=torch.bool)[None]
    m_pad = (qk == KIND_PAD) & eye
    return (m_prompt | m_clean | m_noisy | m_pad)[:, None]


def make_batch(rng: random.Random, n: int, tok: ByteTokenizer, held_out: set[str], rows=None):
    rows = rows or [build_row(sample_example(rng, held_out), tok, rng, COPIES) for _ in range(n)]
    s = max(len(r[0]) for r in rows)
    def pad(i, v):
        return torch.tensor([r[i] + [v] * (s - len(r[i])) for r in rows], dtype=torch.long)
    ids, pos, kind, blk, rep = pad(0, tok.PAD), pad(1, 0), pad(2, KIND_PAD), pad(3, -2), pad(4, 0)
    tgt, lf = pad(5, 0), pad(6, 0)
    return ids, pos, training_mask(kind, blk, rep), tgt, lf.bool()


def make_ar_batch(rows, tok: ByteTokenizer):
    """The warm-up task: next-token prediction on [prompt | answer + EOS] with a causal mask.

    An autoregressive transformer learns to copy from its context (induction) within a few hundred
    steps; under the masked objective alone the same circuit had not formed after 1000+ steps
    (docs/model_card.md). So the tiny model starts autoregressive, as Dream and SDAR start from an
    autoregressive checkpoint; the copying carries over to the denoiser within a few hundred steps
    (no logit shift needed: a masked position reads its left neighbour's next-token guess)."""
    seqs, n_prompt = [r[7] for r in rows], [r[8] for r in rows]
    s = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), s), tok.PAD, dtype=torch.long)
    tgt = torch.zeros(len(seqs), s, dtype=torch.long)
    lf = torch.zeros(len(seqs), s, dtype=torch.bool)
    for b, (q, np_) in enumerate(zip(seqs, n_prompt)):
        ids[b, :len(q)] = torch.tensor(q)
        tgt[b, :len(q) - 1] = torch.tensor(q[1:])
        lf[b, np_ - 1:len(q) - 1] = True
    pos = torch.arange(s)[None].expand(len(seqs), s)
    mask = torch.tril(torch.ones(s, s, dtype=torch.bool))[None, None].expand(len(seqs), 1, s, s)
    return ids, pos, mask, tgt, lf


def save(model: DLLM, out: Path, meta: dict) -> None:
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tmp = out / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(hf_config_dict(model.config), indent=2) + "\n")
    (out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")


def parse_mix(text: str, flag: str) -> dict[str, float]:
    """``fam=w,fam=w`` -> family weights (a one-line error for an unknown family or a bad weight)."""
    out = {}
    for item in filter(None, text.split(",")):
        fam, _, w = item.partition("=")
        if fam not in MIX:
            raise UserError(f"{flag}: unknown family {fam!r} (known: {', '.join(MIX)})")
        try:
            out[fam] = float(w)
        except ValueError:
            raise UserError(f"{flag}: {item!r} is not family=weight") from None
    return out


def cpu_bf16_native(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU multiplies bfloat16 in hardware (AMX or AVX512-BF16), from /proc/cpuinfo's
    flags; None where that cannot be read. Without them torch emulates the bf16 products and an
    autocast step is slower than an fp32 one (docs/training.md)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    if not flags:
        return None
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_arguments(ap)
    return ap


def main(argv=None) -> None:
    try:
        run(parser().parse_args(argv))
    except UserError as e:
        raise SystemExit(f"error: {e}") from None


def run(args) -> None:
    """Train with the parsed flags (``dllm-deploy train``, ``main``)."""
    global SUFFIX_SHARE, COPIES, MAX_ANSWER, DIST
    SUFFIX_SHARE, COPIES, MAX_ANSWER, DIST = args.suffix_share, args.copies, args.max_answer, args.dist
    MIX.update(parse_mix(args.mix, "--mix"))
    ar_mix = {**MIX, **parse_mix(args.ar_mix, "--ar-mix")}

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    tok = ByteTokenizer()
    cfg = tiny_config(args.hidden, args.layers, args.heads, args.kv_heads, args.ffn)
    model = DLLM(cfg)
    dev = torch.device(args.device)
    if args.autocast == "bf16" and dev.type == "cpu" and cpu_bf16_native() is False:
        print("warning: --autocast bf16 on a CPU without AMX or AVX512-BF16: torch emulates the bf16 products, "
              "so steps are slower than fp32 (--autocast none)", file=sys.stderr, flush=True)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02 if "down_proj" not in name and "o_proj" not in name
                                  else 0.02 / math.sqrt(2 * cfg.num_layers))
    previous = None
    if args.init_from is not None:
        from safetensors.torch import load_file
        model.load_state_dict(load_file(str(args.init_from / "model.safetensors")))
        meta = args.init_from / "training.json"
        previous = json.loads(meta.read_text()) if meta.exists() else None
    model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    held_out = tasks.eval_prompts()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    log_path = args.log or args.out / "train_log.jsonl"
    if not args.time_steps:
        args.out.mkdir(parents=True, exist_ok=True)
        log_f = open(log_path, "a" if args.init_from else "w")
    t0 = time.time()
    ema = None
    pending: list = []
    tokens_seen = 0
    ar_end = args.ar_steps         # last warm-up step (lowered by --ar-until-loss)
    bound_hit = False
    print(f"params {n_params/1e6:.2f}M  steps {args.steps}  batch {args.batch}", flush=True)
    for step in range(1, args.steps + 1):
        done = step / args.steps
        if args.anneal_by_time and args.time_limit:
            done = max(done, (time.time() - t0) / args.time_limit)
        lr = args.lr * min(1.0, step / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))
        for g in opt.param_groups:
            g["lr"] = lr
        ar = step <= ar_end
        if step == ar_end + 1 and ar_mix != MIX:
            pending = []   # the warm-up's mix ends with it
        if not pending:  # draw --pool batches at once and bucket them by length: less padding
            rows = sorted((build_row(sample_example(rng, held_out, ar_mix if ar else MIX), tok, rng, COPIES)
                           for _ in range(args.pool * args.batch)), key=lambda r: len(r[0]))
            pending = [rows[i:i + args.batch] for i in range(0, len(rows), args.batch)]
            rng.shuffle(pending)
        rows = pending.pop()
        # warm-up: next-token prediction, causal mask (logits at i predict i+1);
        # then block diffusion: cross-entropy on the masked positions
        batch = make_ar_batch(rows, tok) if ar else make_batch(rng, args.batch, tok, held_out, rows=rows)
        ids, pos, mask, tgt, lf = (x.to(dev) for x in batch)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            logits, _ = model(ids, pos, mask)
        logits = logits.float()
        loss = F.cross_entropy(logits[lf], tgt[lf])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            acc = (logits[lf].argmax(-1) == tgt[lf]).float().mean().item()
        if step == ar_end + 1:
            ema = None   # the diffusion loss starts its own average
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if ar and args.ar_until_loss and not bound_hit and step >= AR_MIN_STEPS and ema <= args.ar_until_loss:
            # the warm-up loss drops sharply once copying works: switch after the margin
            bound_hit, ar_end = True, min(args.ar_steps, step + args.ar_margin)
            print(f"warm-up loss average {ema:.3f} <= {args.ar_until_loss} at step {step}: warm-up ends at step {ar_end}",
                  flush=True)
        if args.time_steps and step >= args.time_steps:
            print(f"{(time.time()-t0)/step:.2f}s/step  seq {ids.shape[1]}", flush=True)
            return
        tokens_seen += int(ids.numel())
        if not args.time_steps and (step % 25 == 0 or step == 1):
            rec = {"phase": 2 if args.init_from else 1, "step": step, "loss": round(loss.item(), 4), "loss_ema": round(ema, 4), "masked_acc": round(acc, 4),
                   "objective": "ar" if ar else "mdm",
                   "lr": round(lr, 6), "tokens": tokens_seen, "elapsed_s": round(time.time() - t0, 1)}
            log_f.write(json.dumps(rec) + "\n")
            log_f.flush()
            print(json.dumps(rec), flush=True)
        timed_out = bool(args.time_limit) and time.time() - t0 >= args.time_limit
        if step % args.save_every == 0 or step == args.steps or step == args.stop_after or timed_out:
            save(model, args.out, {"init_from": str(args.init_from) if args.init_from else None, "seed": args.seed, "steps": step, "target_steps": args.steps, "batch": args.batch,
                                   "lr": args.lr, "lr_last": round(lr, 8), "params": n_params, "elapsed_s": round(time.time() - t0, 1),
                                   "mix": MIX, "ar_mix": ar_mix, "pool": args.pool, "warmup": args.warmup, "threads": args.threads, "device": args.device, "torch": torch.__version__,
                                   "suffix_share": SUFFIX_SHARE, "copies": COPIES, "max_answer": MAX_ANSWER, "dist": DIST, "ar_steps": args.ar_steps,
                                   "ar_until_loss": args.ar_until_loss, "ar_margin": args.ar_margin, "ar_steps_used": min(ar_end, step), "stop_after": args.stop_after,
                                   "stopped_by_time_limit": timed_out, "anneal_by_time": args.anneal_by_time,
                                   "autocast": args.autocast, "previous_phase": previous})
        if step == args.stop_after or timed_out:
            break
    log_f.close()


if __name__ == "__main__":
    main()
