#!/usr/bin/env bash
# Reproduce the decoding tables quoted in docs/model_card.md and docs/algorithms.md.
# Usage: scripts/eval_tables.sh [N_PER_FAMILY] [OUT_DIR]     (defaults: 50, benchmarks/eval)
set -euo pipefail
N=${1:-50}
OUT=${2:-benchmarks/eval}
CLI=${CLI:-.venv/bin/dllm-deploy}
mkdir -p "$OUT"
run() { local name=$1; shift; echo "== $name" >&2; $CLI eval --model tiny --n "$N" --json "$@" > "$OUT/$name.json"; }
run vanilla --strategy vanilla
run threshold_0.9 --strategy threshold --threshold 0.9 --tasks upper,reverse,kv,csv,count,letter
for W in 1 2 4 8; do
  tree=chain; [ "$W" -ge 4 ] && tree=wide
  run spd_lossless_vanilla_W$W --strategy spd --beam-width "$W" --tree "$tree" --select lossless --base vanilla --tasks upper,reverse,kv,csv,count,letter
done
run spd_lossless_threshold_W4 --strategy spd --beam-width 4 --tree wide --select lossless --base threshold --threshold 0.9 --tasks upper,reverse,kv,csv,count,letter
run spd_threshold_W4 --strategy spd --beam-width 4 --select threshold --tasks upper,reverse,kv,csv,count,letter
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print(f"| run | accuracy | TPF | forwards | tokens | tok/s |")
print("|---|---|---|---|---|---|")
for f in sorted(out.glob("*.json")):
    d = json.loads(f.read_text())
    o = d["overall"]
    print(f"| {f.stem} | {o['accuracy']:.3f} | {o['tpf']:.2f} | {o['forwards']} | {o['tokens']} | {o['tokens_per_s']:.1f} |")
PY
