"""lab/aiperf.sh's helper.

    python lab/aiperf_table.py prompts OUT.jsonl               the eval split's task prompts as AIPerf single_turn lines
    python lab/aiperf_table.py tokenizer DIR                   a byte-level Hugging Face tokenizer for AIPerf to load
    python lab/aiperf_table.py table DIR "1 4 16" OUT.json     AIPerf's summaries per level -> OUT.json + a markdown table
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# AIPerf's metric tags -> (column, unit in its export)
METRICS = {"time_to_first_token": "TTFT ms", "inter_chunk_latency": "per-chunk ms",
           "request_latency": "latency ms", "output_token_throughput": "output tokens/s",
           "request_throughput": "requests/s"}


def prompts(out: str) -> None:
    from dllm_deploy.evals.tasks import FAMILIES, eval_split
    split = eval_split(families=FAMILIES)
    groups = [[e for e in split if e.family == f] for f in FAMILIES]
    lines = [json.dumps({"text": e.prompt.strip()}) for group in zip(*groups) for e in group]
    Path(out).write_text("\n".join(lines) + "\n")


def tokenizer(folder: str) -> None:
    """One token per byte (the tiny model's own tokenizer is not a Hugging Face one): AIPerf loads a
    tokenizer to build its dataset even when it counts tokens from the server's usage."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    Path(folder).mkdir(parents=True, exist_ok=True)
    tok.save(str(Path(folder) / "tokenizer.json"))
    (Path(folder) / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))


def _summary(folder: Path) -> dict:
    """The profiling phase's summary (phases/warmup/ holds the warm-up's own)."""
    path = folder / "profile_export_aiperf.json"
    if not path.is_file():
        raise SystemExit(f"{path}: missing (see {folder}.log)")
    return json.loads(path.read_text())


def table(folder: str, levels: str, out: str) -> None:
    rows = []
    for c in levels.split():
        s = _summary(Path(folder) / f"c{c}")
        row = {"concurrency": int(c)}
        for tag in METRICS:
            m = s.get(tag) or {}
            row[tag] = {k: m.get(k) for k in ("avg", "p50", "p99", "unit") if k in m}
        row["request_count"] = (s.get("completed_request_count") or {}).get("avg", 0)
        row["error_request_count"] = sum(e.get("count", 0) for e in s.get("error_summary") or [])
        row["completion_tokens_per_request"] = (s.get("usage_completion_tokens") or {}).get("avg")
        rows.append(row)
    Path(out).write_text(json.dumps({"tool": "aiperf 0.13.0", "endpoint": "/v1/chat/completions (streaming)",
                                     "levels": rows}, indent=2) + "\n")
    print("| concurrency | requests | errors | TTFT p50 / p99 ms | per-chunk p50 ms | latency p50 / p99 ms "
          "| output tokens/s | requests/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        def f(tag, k):
            v = r[tag].get(k)
            return "-" if v is None else f"{v:.1f}" if v >= 10 else f"{v:.2f}"
        print(f"| {r['concurrency']} | {r['request_count']:.0f} | {r['error_request_count']:.0f} | "
              f"{f('time_to_first_token', 'p50')} / {f('time_to_first_token', 'p99')} | {f('inter_chunk_latency', 'p50')} | "
              f"{f('request_latency', 'p50')} / {f('request_latency', 'p99')} | {f('output_token_throughput', 'avg')} | "
              f"{f('request_throughput', 'avg')} |")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"prompts": prompts, "tokenizer": tokenizer, "table": table}[cmd](*args)
