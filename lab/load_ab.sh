#!/bin/bash
# The load table of docs/serving.md: three servers up at once over the tiny artifact (one request
# at a time, static batches of 8, continuous batching up to 8), concurrency levels interleaved so
# that the machine's load changes hit every server alike. Needs build/tiny
# (dllm-deploy export --model tiny --out build/tiny); writes build/ab/ and lab/load-*.json.
cd "$(dirname "$0")/.."
GEN=${GEN:-64}; REQUESTS=${REQUESTS:-24}; LEVELS=${LEVELS:-"1 2 4 8 16 32"}
mkdir -p build/ab
SERVERS=("one-at-a-time 18000 --max-batch-size 1" "static 18100 --static-batches" "continuous 18200")
start() { local port=$1; shift
  (PYTHONPATH=$PWD setsid ${PYTHON:-python} -m dllm_deploy.cli serve --artifact build/tiny --gen-length $GEN "$@" \
     --http-port $port --grpc-port $((port+1)) --metrics-port $((port+2)) > build/ab/serve-$port.log 2>&1 & echo $! > build/ab/serve-$port.pid)
  for i in $(seq 240); do curl -sf localhost:$port/v2/models/dllm_stream/ready > /dev/null && return; sleep 0.5; done
  echo "serve on $port did not start (build/ab/serve-$port.log)"; exit 1; }
for s in "${SERVERS[@]}"; do set -- $s; name=$1; port=$2; shift 2; start $port "$@"; done
for c in $LEVELS; do for s in "${SERVERS[@]}"; do set -- $s
  PYTHONPATH=$PWD ${PYTHON:-python} -m dllm_deploy.cli loadtest --artifact build/tiny --gen-length $GEN \
    --url http://127.0.0.1:$2 --concurrency $c --requests $REQUESTS --json-out build/ab/$1-c$c.json > build/ab/$1-c$c.out 2>&1
  echo "$1 c$c rc=$? $(uptime | sed 's/.*average: //')" >> build/ab/log
done; done
for s in "${SERVERS[@]}"; do set -- $s; kill -TERM $(cat build/ab/serve-$2.pid); done
echo done >> build/ab/log
