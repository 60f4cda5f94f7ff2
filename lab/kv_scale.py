"""KV at scale: time per block against prompt length on a 331M block-causal (SDAR-layout) model,
exact cache, ONNX Runtime fp32, 2 threads: the artifact whose commits return the whole cache
(kv_io "append") against the one that returns the new tokens' keys and values and keeps the cache
in a buffer written in place (kv_io "new"), in one run.

    PYTHONPATH=$PWD .venv/bin/python lab/kv_scale.py --work /tmp/kv --json lab/kv_scale.json

Writes a random SDAR-layout checkpoint (hidden 1024, 20 layers, 16 query / 8 KV heads of 64, MLP
4096, vocabulary 8192, block 32) with the peers' byte-level BPE (lab/peers/checkpoint.py),
exports it once per kv_io (fp32), then for each prompt length P decodes 3 blocks of 32 with vanilla k 4
(8 forwards a block: 7 verifications of the block and one commit that caches the finished block
and predicts the next) and times every engine call. The first block (the prompt's own prefill)
is left out; a block is the calls of blocks 2 and 3. Interleaved repeats (P and kv_io), medians;
the two artifacts' tokens are compared.

Per P: ms per verification (T = 32 tokens attending P + 32 positions), ms per commit (T = 64:
the finished block and the next; its KV joins the cache), ms per block, and the KV bytes the cache
holds. The attention's own work grows linearly in P, a commit's at twice a verification's rate (twice
the queries); what a commit's time grows by beyond that is cache handling (docs/export.md).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

THREADS, BLOCK, K = 2, 32, 4
RAW = {"model_type": "sdar", "architectures": ["SDARForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 20,
       "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 4096,
       "vocab_size": 8192, "mask_token_id": 8191, "eos_token_id": 8190, "bos_token_id": 8189, "block_size": BLOCK,
       "max_position_embeddings": 8192, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def build(work: Path, kv_io: str) -> Path:
    """The checkpoint and its fp32 artifact of ``kv_io`` under ``work`` (kept between runs)."""
    from lab.big_export import write_sharded
    from lab.peers.checkpoint import write_tokenizer
    ckpt, art = work / "ckpt", work / f"art-{kv_io}"
    if not (ckpt / "tokenizer.json").exists():
        total = write_sharded(ckpt, RAW, seed=0, scale=0.1)
        write_tokenizer(ckpt)
        print(f"{ckpt}: {total / 4 / 1e6:.1f}M parameters", flush=True)
    if not (art / "manifest.json").exists():
        from dllm_deploy.export.exporter import export
        t0 = time.perf_counter()
        export(str(ckpt), art, log=lambda m: None, kv_io=kv_io)
        print(f"{art}: exported in {time.perf_counter() - t0:.0f} s", flush=True)
    return art


class Timed:
    """Wraps a backend's prefill / verify: each call's kind, tokens fed, cache length and seconds."""

    def __init__(self, backend):
        self.calls: list[tuple[str, int, int, float]] = []
        for kind, name in (("commit", "prefill"), ("verify", "verify")):
            setattr(backend, name, self._wrap(kind, getattr(backend, name)))

    def _wrap(self, kind, fn):
        def call(cache, ids, *rest, **kw):
            p, t0 = cache.length, time.perf_counter()
            out = fn(cache, ids, *rest, **kw)
            self.calls.append((kind, ids.shape[1], p, time.perf_counter() - t0))
            return out
        return call


def prompt_of(tok, n: int) -> str:
    """Text of about ``n`` tokens: the standard library's sources, cut at ``n`` ids and decoded."""
    from lab.peers.checkpoint import corpus
    text = "".join(corpus(limit_bytes=max(200_000, 16 * n)))
    return tok.decode(tok.encode(text)[: n])


def once(rt, prompt: str, timed: Timed) -> dict:
    timed.calls.clear()
    r = rt.generate([prompt], strategy="vanilla", tokens_per_step=K, gen_length=3 * BLOCK, block_length=BLOCK,
                    cache="exact")[0]
    first = next(i for i, c in enumerate(timed.calls) if c[0] == "commit" and c[2] > 0)   # block 1's commit
    rest = timed.calls[first:]
    return {"forwards": r.forwards, "ids": list(r.token_ids), "verify_s": [c[3] for c in rest if c[0] == "verify"],
            "commit_s": [c[3] for c in rest if c[0] == "commit"], "block_s": sum(c[3] for c in rest) / 2,
            "prefill_s": sum(c[3] for c in timed.calls[:first] if c[0] == "commit" and c[2] == 0),
            "cache_len": max(c[2] for c in rest)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="checkpoint and artifact folder (reused)")
    ap.add_argument("--prompts", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    from dllm_deploy.runtime.api import Runtime
    modes = ("append", "new")
    rts = {m: Runtime.load(artifact=str(build(a.work, m)), threads=THREADS, profile="cpu-x86_64") for m in modes}
    timed = {m: Timed(rt.backend) for m, rt in rts.items()}
    prompts = {n: prompt_of(rts["append"].tokenizer, n) for n in a.prompts}
    runs: dict = {(m, n): [] for m in modes for n in a.prompts}
    for m in modes:
        once(rts[m], prompts[a.prompts[0]], timed[m])                    # warm-up
    for rep in range(a.repeats):
        for n in a.prompts:
            for m in modes:
                runs[m, n].append(once(rts[m], prompts[n], timed[m]))
                print(f"repeat {rep + 1} P {n} {m}: block {runs[m, n][-1]['block_s'] * 1000:.0f} ms", flush=True)
    c = rts["append"].backend.config
    kv_per_pos = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4
    rows = []
    for (m, n), rs in runs.items():
        med = lambda key: statistics.median(x for r in rs for x in (r[key] if isinstance(r[key], list) else [r[key]]))  # noqa: E731
        rows.append({"kv_io": m, "prompt": n, "cache_len": rs[0]["cache_len"], "ms_per_verify": 1000 * med("verify_s"),
                     "ms_per_commit": 1000 * med("commit_s"), "ms_per_block": 1000 * med("block_s"),
                     "prompt_prefill_s": med("prefill_s"), "kv_mb": kv_per_pos * rs[0]["cache_len"] / 2**20,
                     "forwards": rs[0]["forwards"],
                     "same_tokens_as_append": all(r["ids"] == q["ids"] for r, q in zip(rs, runs["append", n]))})
    out = {"model": RAW, "threads": THREADS, "block_length": BLOCK, "tokens_per_step": K, "repeats": a.repeats,
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}, "rows": rows}
    a.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'kv_io':>6} {'P':>6} {'cache':>6} {'verify ms':>10} {'commit ms':>10} {'block ms':>9} {'KV MB':>7} same")
    for r in rows:
        print(f"{r['kv_io']:>6} {r['prompt']:>6} {r['cache_len']:>6} {r['ms_per_verify']:>10.1f} {r['ms_per_commit']:>10.1f} "
              f"{r['ms_per_block']:>9.0f} {r['kv_mb']:>7.0f} {r['same_tokens_as_append']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
