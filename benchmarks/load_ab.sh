#!/bin/bash
# both servers up at once; levels interleaved: batch1 then batch8 at each concurrency, one round
cd "$(dirname "$0")/.."   # the repository root; needs build/tiny (dllm-deploy export --out build/tiny)
mkdir -p build/ab
start() { (PYTHONPATH=$PWD setsid ${PYTHON:-python} -m dllm_deploy.cli serve --artifact build/tiny --gen-length 32 $2 --http-port $1 --grpc-port $(($1+1)) --metrics-port $(($1+2)) > build/ab/serve-$1.log 2>&1 & echo $! > build/ab/serve-$1.pid)
  for i in $(seq 180); do curl -sf localhost:$1/v2/models/dllm_stream/ready && break; sleep 0.5; done; }
start 18000 "--max-batch-size 1"
start 18100 ""
for r in 1; do for c in 1 2 4 8 16 32; do for s in "batch1 18000" "batch8 18100"; do set -- $s
  PYTHONPATH=$PWD ${PYTHON:-python} -m dllm_deploy.cli loadtest --artifact build/tiny --gen-length 32 --url http://127.0.0.1:$2 --concurrency $c --requests 32 --json build/ab/$1-c$c-r$r.json > build/ab/$1-c$c-r$r.out 2>&1
  echo "$1 c$c r$r rc=$? $(uptime | sed 's/.*average: //')" >> build/ab/log
done; done; done
kill -TERM $(cat build/ab/serve-18000.pid) $(cat build/ab/serve-18100.pid)
echo done >> build/ab/log
