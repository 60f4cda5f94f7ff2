"""Fine-tune the bundled tiny dLLM into a tri-mode (self-speculative) model: one weight set that
decodes autoregressively and drafts blocks by diffusion, as Nemotron-Labs-Diffusion is trained
(joint loss L_AR + alpha * L_diff on the same weights), in that family's layout.

    dllm-deploy train-selfspec --out checkpoints/tiny-selfspec     # make train-selfspec

Each training row is ``[clean | noisy]`` over one sequence (prompt, answer, EOS):
- the clean copy attends causally; its logit i is scored against token i+1 over the answer (the
  autoregressive loss, as the causal verifier reads it);
- the noisy copy splits the sequence into blocks of L at a random offset; a block keeps its first
  token (the seed the verifier emitted) and masks the rest, all of them for ``full_share`` of the
  blocks (the LinearSpec draft: [seed, MASK x (L-1)]), else each with probability t ~ U(0,1).
  A noisy block attends the clean tokens before it (the cached causal prefix) and itself
  bidirectionally; its logit i is scored against token i (unshifted) at masked answer positions.

The output folder is a checkpoint of the ``nemotron_labs_diffusion`` model type in that family's
tensor names (``encoder.*``, ``diffusion_head``), with the byte tokenizer.
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
from ..models.config import DLLMConfig
from ..models.registry import get_family
from ..models.tokenizer import ByteTokenizer
from .train import sample_example
from ..models.transformer import DLLM
from .flags import SELF_SPEC_BLOCK, add_self_spec_arguments

BLOCK = SELF_SPEC_BLOCK
FULL_SHARE = 0.6     # share of noisy blocks fully masked after their seed (the LinearSpec draft)


def hf_config(cfg: DLLMConfig) -> dict:
    """config.json of the tri-mode model (the nemotron_labs_diffusion keys)."""
    return {
        "model_type": "nemotron_labs_diffusion", "architectures": ["NemotronLabsDiffusionModel"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "intermediate_size": cfg.intermediate_size, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_seq, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "mask_token_id": cfg.mask_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
        "block_size": cfg.block_size, "dlm_paradigm": "bidirectional", "tokenizer": "byte",
    }


def make_batch(rng: random.Random, n: int, tok: ByteTokenizer, held_out: set[str], block: int = BLOCK,
               full_share: float = FULL_SHARE):
    """ids (B,2S), pos (B,2S), mask (B,1,2S,2S), targets (B,2S), ar flags (B,2S), diffusion flags (B,2S);
    ``held_out``: prompts never trained on (the evaluation splits')."""
    seqs = []
    for _ in range(n):
        ex = sample_example(rng, held_out)
        p, a = tok.encode(ex.prompt), tok.encode(ex.answer) + [tok.EOS]
        seqs.append((p + a, len(p)))
    s = max(len(q) for q, _ in seqs)
    ids = torch.full((n, 2 * s), tok.PAD, dtype=torch.long)
    tgt = torch.zeros(n, 2 * s, dtype=torch.long)
    ar = torch.zeros(n, 2 * s, dtype=torch.bool)
    dif = torch.zeros(n, 2 * s, dtype=torch.bool)
    mask = torch.zeros(n, 1, 2 * s, 2 * s, dtype=torch.bool)
    causal = torch.tril(torch.ones(s, s, dtype=torch.bool))
    for b, (q, n_prompt) in enumerate(seqs):
        m = len(q)
        x = torch.tensor(q)
        ids[b, :m] = x
        tgt[b, :m - 1] = x[1:]
        ar[b, n_prompt - 1:m - 1] = True
        mask[b, 0, :s, :s] = causal
        mask[b, 0, :s, m:s] = False
        offset = rng.randrange(block)
        starts = [0] + list(range(offset or block, m, block))
        noisy = x.clone()
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else m
            ratio = 1.0 if rng.random() < full_share else rng.random()
            for j in range(start + 1, end):
                if j >= n_prompt and rng.random() < ratio:
                    noisy[j] = tok.MASK
                    dif[b, s + j] = True
            mask[b, 0, s + start:s + end, :start] = True            # the clean prefix
            mask[b, 0, s + start:s + end, s + start:s + end] = True  # the block, both ways
        ids[b, s:s + m] = noisy
        tgt[b, s:s + m] = x
        for j in range(m, s):                                    # padding attends itself only
            mask[b, 0, j, j] = mask[b, 0, s + j, s + j] = True
    pos = torch.arange(s).repeat(2)[None].expand(n, 2 * s)
    return ids, pos, mask, tgt, ar, dif


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_self_spec_arguments(ap)
    try:
        run(ap.parse_args(argv))
    except UserError as e:
        raise SystemExit(f"error: {e}") from None


def _shown(path: Path) -> Path:
    """``path`` relative to the working folder where it lies under it (the training record's form)."""
    path = path.resolve()
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


def command(args) -> str:
    """The command line that repeats a run with ``args`` (its training record's "command")."""
    return (f"dllm-deploy train-selfspec --out {args.out} --init-from {_shown(args.init_from)} --steps {args.steps} "
            f"--batch {args.batch} --lr {args.lr} --warmup {args.warmup} --alpha {args.alpha} --block {args.block} --seed {args.seed} "
            f"--threads {args.threads}")


def run(args) -> None:
    """Fine-tune with the parsed flags (``dllm-deploy train-selfspec``, ``main``)."""
    for flag in ("steps", "batch", "warmup", "block", "threads"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    tok = ByteTokenizer()
    src = DLLMConfig.from_file(args.init_from / "config.json")
    kind = json.loads((args.init_from / "config.json").read_text()).get("model_type")
    if kind != "dllm_block":
        raise UserError(f"--init-from {args.init_from}: expected a checkpoint of the bundled tiny model's layout "
                        f"(model_type dllm_block, as `dllm-deploy train` writes), got {kind!r}")
    raw = hf_config(src)
    raw["block_size"] = args.block
    cfg = DLLMConfig.from_hf(raw)
    model = DLLM(cfg)
    from safetensors.torch import load_file, save_file
    model.load_state_dict(load_file(str(args.init_from / "model.safetensors")))
    from ..evals.tasks import eval_prompts
    held_out = eval_prompts()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / "train_log.jsonl", "w")
    t0, ema = time.time(), None
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, pos, mask, tgt, ar, dif = make_batch(rng, args.batch, tok, held_out, args.block)
        logits, _ = model(ids, pos, mask)
        ce = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none").view_as(tgt)
        l_ar, l_dif = ce[ar].mean(), ce[dif].mean()
        loss = l_ar + args.alpha * l_dif
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 25 == 0 or step == args.steps:
            with torch.no_grad():
                pred = logits.argmax(-1)
                acc_ar = (pred[ar] == tgt[ar]).float().mean().item()
                acc_dif = (pred[dif] == tgt[dif]).float().mean().item()
            rec = {"step": step, "loss": round(loss.item(), 4), "loss_ema": round(ema, 4), "ar_loss": round(l_ar.item(), 4),
                   "diff_loss": round(l_dif.item(), 4), "ar_acc": round(acc_ar, 4), "diff_acc": round(acc_dif, 4),
                   "lr": round(lr, 6), "elapsed_s": round(time.time() - t0, 1)}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(json.dumps(rec), file=sys.stderr, flush=True)
    fam = get_family(cfg.layout)
    tensors = {fam.to_theirs(k): v.detach().contiguous() for k, v in model.state_dict().items()}
    tmp = args.out / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(args.out / "model.safetensors")
    (args.out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    meta = {"init_from": str(_shown(args.init_from)), "steps": args.steps, "batch": args.batch, "lr": args.lr,
            "alpha": args.alpha, "block": args.block, "full_share": FULL_SHARE, "seed": args.seed,
            "threads": args.threads, "torch": torch.__version__, "elapsed_s": round(time.time() - t0, 1),
            "command": command(args)}
    (args.out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    main()
