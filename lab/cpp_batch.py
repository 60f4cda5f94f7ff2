"""Tokens/s of the C++ runtime decoding 4 prompts as one batch vs one prompt at a time.

    python lab/cpp_batch.py --artifact DIR [--repeats 5] [--strategy spd ...decode flags]

Runs build/cpp/dllm-generate --prompts-file (4 eval prompts) with --batch-size 4 and with
--batch-size 1, alternately, `--repeats` times each; tokens/s of a run = all rows' tokens / the
decode seconds of its calls (each call's wall_s once: a batch's rows share it). Prints the medians
and the speed-up as one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def prompts(n: int) -> list[str]:
    """The first eval prompt of n families (different lengths)."""
    from dllm_deploy.evals import tasks
    return [ex.prompt for ex in tasks.eval_split(n=1)][:n]


def tokens_per_s(binary: Path, artifact: str, pfile: Path, batch: int, decode: list[str]) -> float:
    r = subprocess.run([str(binary), "--artifact", artifact, "--prompts-file", str(pfile), "--json",
                        "--batch-size", str(batch), *decode], check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    calls = [rows[i]["wall_s"] for i in range(0, len(rows), batch)]   # one wall_s per call
    return sum(x["tokens"] for x in rows) / sum(calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--binary", default=str(REPO / "build" / "cpp" / "dllm-generate"))
    ap.add_argument("--rows", type=int, default=4, help="prompts (the batch size)")
    ap.add_argument("--repeats", type=int, default=5)
    a, decode = ap.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        pfile = Path(tmp) / "prompts.jsonl"
        pfile.write_text("".join(json.dumps(p) + "\n" for p in prompts(a.rows)))
        runs: dict[int, list[float]] = {a.rows: [], 1: []}
        for _ in range(a.repeats):
            for batch in runs:
                runs[batch].append(tokens_per_s(Path(a.binary), a.artifact, pfile, batch, decode))
    med = {b: statistics.median(v) for b, v in runs.items()}
    print(json.dumps({"rows": a.rows, "decode": decode, "repeats": a.repeats,
                      f"batch_{a.rows}_tokens_per_s": round(med[a.rows], 1),
                      "batch_1_tokens_per_s": round(med[1], 1), "speedup": round(med[a.rows] / med[1], 2),
                      "runs": {str(b): [round(x, 1) for x in v] for b, v in runs.items()}}))


if __name__ == "__main__":
    main()
