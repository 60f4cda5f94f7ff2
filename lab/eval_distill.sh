#!/usr/bin/env bash
# The before/after-distillation eval tables of docs/distill.md: every decoding rule on both splits
# (core: in distribution; general: held-out words and lengths), 50 prompts per family, ONNX Runtime.
# Usage: lab/eval_distill.sh ARTIFACT OUT_DIR [N_PER_FAMILY] [RUNS]
#   RUNS: all (default: the lossless SPD rows too, on the core split), rules (none: lossless SPD is
#   token-identical to its base rule, so those rows add TPF only), far (the far-threshold rows only)
#   or lead (the lead-threshold rows with the far threshold, core split only)
# e.g. dllm-deploy export --model tiny --out build/art && lab/eval_distill.sh build/art lab/eval-broad/E
# (the bundled model's tables; lab/eval-distill/ holds lab/tiny-core's and its students')
set -euo pipefail
ART=$1
OUT=$2
N=${3:-50}
RUNS=${4:-all}
CLI=${CLI:-.venv/bin/dllm-deploy}
FAMS=upper,reverse,kv,csv,count,letter
run() {
  local split=$1 name=$2; shift 2
  mkdir -p "$OUT/$split"
  echo "== $split $name" >&2
  $CLI eval --artifact "$ART" --split "$split" --n "$N" --tasks $FAMS --json "$@" > "$OUT/$split/$name.json"
}
if [ "$RUNS" = lead ]; then
  for TAU in 0.9 0.95 0.98 0.99; do
    run core threshold_${TAU}_far_0.999_lead_0.7 --strategy threshold --threshold "$TAU" --threshold-far 0.999 --threshold-lead 0.7
  done
  exit 0
fi
for SPLIT in core general; do
  for TAU in 0.9 0.95 0.97 0.98; do
    run $SPLIT threshold_${TAU}_far_0.999 --strategy threshold --threshold "$TAU" --threshold-far 0.999
  done
  [ "$RUNS" = far ] && continue
  run $SPLIT vanilla --strategy vanilla
  for TAU in 0.9 0.95 0.99; do
    run $SPLIT threshold_$TAU --strategy threshold --threshold "$TAU"
  done
  run $SPLIT threshold_0.95_dynamic_0.8 --strategy threshold --threshold 0.95 --threshold-floor 0.8
  run $SPLIT threshold_0.99_dynamic_0.9 --strategy threshold --threshold 0.99 --threshold-floor 0.9
  run $SPLIT spd_lossy_W4 --strategy spd --beam-width 4 --select threshold
  if [ "$RUNS" = all ] && [ "$SPLIT" = core ]; then
    for W in 2 4 8; do
      run $SPLIT spd_lossless_vanilla_W$W --strategy spd --beam-width "$W" --select lossless --base vanilla
    done
    run $SPLIT spd_lossless_threshold_0.9_W4 --strategy spd --beam-width 4 --select lossless --base threshold --threshold 0.9
  fi
done
python3 lab/eval_table.py "$OUT"
