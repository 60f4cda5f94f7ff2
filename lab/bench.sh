#!/usr/bin/env bash
# The bench run behind docs/BENCHMARKS.md: speed at equal quality (20 held-out prompts per family,
# so one point of accuracy is about one prompt), torch only as the LLaDA vanilla no-cache baseline,
# every ONNX Runtime configuration in fp32 and in int8 (the artifact needs both: export --precision fp32,int8),
# every threshold configuration with the exact cache and with the delayed in-block cache.
# Usage: lab/bench.sh ARTIFACT OUT.json [REPEATS]   (about 70 minutes on 2 idle cores at 3 repeats)
set -euo pipefail
ART=$1
OUT=$2
REPEATS=${3:-3}
CLI=${CLI:-.venv/bin/dllm-deploy}
$CLI bench --artifact "$ART" --backends torch:vanilla,ort --strategies vanilla,threshold,spd \
  --thresholds 0.9,0.98,0.99 --threshold-floors 0.8 --threshold-fars 0.999 --threshold-leads 0.7 --precisions fp32,int8 --caches auto,delayed --beam-widths 4 --n 20 --repeats "$REPEATS" --gen-length 128 \
  --json-out "$OUT" --tune --tune-out "${OUT%.json}-tuned-profile.yaml"
