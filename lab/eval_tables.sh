#!/usr/bin/env bash
# Reproduce the decoding table of docs/algorithms.md measured on lab/tiny-core (its JSON in
# lab/eval/; the bundled model's tables come from lab/eval_distill.sh).
# Usage: lab/eval_tables.sh [N_PER_FAMILY] [OUT_DIR]     (defaults: 50, lab/eval)
# MODEL="--model lab/tiny-core" (torch, the default) or MODEL="--artifact build/art"
# (ONNX Runtime, faster; token-identical to torch up to ties, see tests/integration/export).
set -euo pipefail
N=${1:-50}
OUT=${2:-lab/eval}
CLI=${CLI:-.venv/bin/dllm-deploy}
MODEL=${MODEL:---model lab/tiny-core}
FAMS=upper,reverse,kv,csv,count,letter
mkdir -p "$OUT"
rm -f "$OUT"/*.json
# shellcheck disable=SC2086
run() { local name=$1; shift; echo "== $name" >&2; $CLI eval $MODEL --n "$N" --json "$@" > "$OUT/$name.json"; }
run vanilla --strategy vanilla
for TAU in 0.9 0.95 0.99; do
  run threshold_$TAU --strategy threshold --threshold "$TAU" --tasks $FAMS
done
for W in 1 2 4 8; do
  run spd_lossless_vanilla_W$W --strategy spd --beam-width "$W" --tree fork --select lossless --base vanilla --tasks $FAMS
  run spd_lossless_threshold_W$W --strategy spd --beam-width "$W" --tree fork --select lossless --base threshold --threshold 0.9 --tasks $FAMS
  run spd_lossy_W$W --strategy spd --beam-width "$W" --tree fork --select threshold --tasks $FAMS
done
# the chain tree at W 8 (the default before the fork tree) and lossy-mode pruning of 16 drafted nodes to 4
run spd_lossless_vanilla_W8_chain --strategy spd --beam-width 8 --tree chain --select lossless --base vanilla --tasks $FAMS
run spd_lossless_threshold_W8_chain --strategy spd --beam-width 8 --tree chain --select lossless --base threshold --threshold 0.9 --tasks $FAMS
run spd_lossy_W8_chain --strategy spd --beam-width 8 --tree chain --select threshold --tasks $FAMS
# lossless SPD over the threshold rule at tau 0.99 (the tau at which threshold keeps vanilla's accuracy)
for W in 4 8; do
  run spd_lossless_threshold_0.99_W$W --strategy spd --beam-width "$W" --tree fork --select lossless --base threshold --threshold 0.99 --tasks $FAMS
done
run spd_lossy_W4_pruned16 --strategy spd --beam-width 4 --tree fork --candidates 16 --select threshold --tasks $FAMS
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("| run | accuracy | TPF | forwards | tokens | tok/s |")
print("|---|---|---|---|---|---|")
for f in sorted(out.glob("*.json")):
    d = json.loads(f.read_text())
    o = d["overall"]
    print(f"| {f.stem} | {o['accuracy']:.3f} | {o['tpf']:.2f} | {o['forwards']} | {o['tokens']} | {o['tokens_per_s']:.1f} |")
PY
