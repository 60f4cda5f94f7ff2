#!/bin/bash
# NVIDIA AIPerf (PyPI aiperf, pinned, in its own venv) against the OpenAI API of `dllm-deploy serve`
# on the tiny artifact: chat completions, streamed, at concurrency 1, 4 and 16 (lab tier, not in
# make test). The prompts are the eval split's task prompts sent as chat user messages
# (lab/aiperf_table.py writes them); token counts are the server's `usage` (the tiny model has
# no Hugging Face tokenizer: AIPerf gets a byte-level one to load, used for nothing it reports here).
# Writes build/aiperf/ (AIPerf's artifacts per level) and lab/aiperf.json, prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
AIPERF_VENV=${AIPERF_VENV:-build/aiperf-venv}
GEN=${GEN:-64}; REQUESTS=${REQUESTS:-64}; LEVELS=${LEVELS:-"1 4 16"}; PORT=${PORT:-18300}
OUT=build/aiperf
mkdir -p $OUT
test -x $AIPERF_VENV/bin/aiperf || { python3 -m venv $AIPERF_VENV && $AIPERF_VENV/bin/pip install -q aiperf==0.13.0; }
test -f build/tiny/manifest.json || $PY -m dllm_deploy.cli export --model tiny --out build/tiny --precision fp32
$PY lab/aiperf_table.py prompts $OUT/prompts.jsonl
$PY lab/aiperf_table.py tokenizer $OUT/tokenizer
(setsid $PY -m dllm_deploy.cli serve --artifact build/tiny --gen-length $GEN --max-batch-size 8 --max-queue 256 \
   --http-port $PORT --grpc-port $((PORT+1)) --metrics-port $((PORT+2)) --openai-port $((PORT+3)) \
   --served-model-name tiny > $OUT/serve.log 2>&1 & echo $! > $OUT/serve.pid)
trap 'kill -TERM $(cat $OUT/serve.pid) 2>/dev/null || true' EXIT
for i in $(seq 240); do curl -sf localhost:$((PORT+3))/health > /dev/null && break; sleep 0.5; done
curl -sf localhost:$((PORT+3))/health > /dev/null || { echo "serve did not start ($OUT/serve.log)"; exit 1; }
for c in $LEVELS; do
  rm -rf $OUT/c$c
  $AIPERF_VENV/bin/aiperf profile --model tiny --url http://127.0.0.1:$((PORT+3)) --endpoint-type chat --streaming \
    --input-file $OUT/prompts.jsonl --custom-dataset-type single_turn --tokenizer $OUT/tokenizer --use-server-token-count \
    --concurrency $c --request-count $REQUESTS --warmup-request-count $c --random-seed 0 --request-timeout-seconds 300 \
    --artifact-dir $OUT/c$c > $OUT/c$c.log 2>&1 || { echo "aiperf failed at concurrency $c ($OUT/c$c.log)"; exit 1; }
done
$PY lab/aiperf_table.py table $OUT "$LEVELS" lab/aiperf.json
