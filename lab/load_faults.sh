#!/bin/bash
# usage: lab/load_faults.sh serve|triton KILL_AFTER_S : start serve, load it, SIGKILL one process, watch, restart
cd "$(dirname "$0")/.."   # the repository root; needs build/tiny (dllm-deploy export --out build/tiny)
start() { (PYTHONPATH=$PWD setsid ${PYTHON:-python} -m dllm_deploy.cli serve --artifact build/tiny --gen-length 32 --http-port 18000 --grpc-port 18001 --metrics-port 18002 > build/serve-$1.log 2>&1 & echo $! > build/serve.pid)
  T=$(date +%s.%N); for i in $(seq 180); do curl -sf localhost:18000/v2/models/dllm_stream/ready && break; sleep 0.5; done
  echo "serve ready after $(echo "$(date +%s.%N) - $T" | bc) s"; }
start first
SP=$(cat build/serve.pid); TP=$(pgrep -P $SP -f tritonserver/bin/tritonserver)
ls -d /tmp/folder* | sort > build/folders-before
PYTHONPATH=$PWD ${PYTHON:-python} -m dllm_deploy.cli loadtest --artifact build/tiny --gen-length 32 --url http://127.0.0.1:18000 --concurrency 4 --requests 24 --timeout 30 --json-out build/fault-$1.json > build/fault-$1.out 2>&1 &
LP=$!
sleep $2
T0=$(date +%s.%N)
if [ $1 = serve ]; then kill -9 $SP; else kill -9 $TP; fi
for i in $(seq 60); do
  L=$(ss -ltn | grep -cE ':1800[012] ')
  P=$(pgrep -f "dllm-serve-|folder.*model.py|serving/reaper.py" | wc -l)
  [ $L = 0 ] && [ $P = 0 ] && { echo "ports closed, no process left after $(echo "$(date +%s.%N) - $T0" | bc) s"; break; }
  sleep 0.2
done
wait $LP; echo "loadtest rc=$? returned $(echo "$(date +%s.%N) - $T0" | bc) s after the kill"
python3 -c "
import json; lv=json.load(open('build/fault-$1.json'))['levels'][0]; print('answered', lv['answered'], 'errors', lv['errors'], 'corrupted', lv['corrupted'], lv['error_examples'])"
wait $SP 2>/dev/null; echo "serve exit: $(grep -a 'dllm-deploy' build/serve-first.log | tail -1)"
echo "left: $(ls -d /tmp/folder* | sort | comm -13 build/folders-before - | tr '\n' ' ') $(ls -d /tmp/dllm-serve-* 2>/dev/null)"
start again
curl -s -X POST localhost:18000/v2/models/dllm/generate -d '{"text_input": "count: 1 2 3", "max_tokens": 8}'; echo
kill -TERM $(cat build/serve.pid); sleep 6; echo "after SIGTERM listening: $(ss -ltn | grep -cE ':1800[012] ')"
