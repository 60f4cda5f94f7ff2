"""``dllm-deploy loadtest``: load a running serve and check every answer against offline generate."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UserError
from .common import add_decode_flags, add_json_flags, csv_list, json_outputs, progress, runtime, write_file
from .serve import serve_defaults


def add_parser(sub) -> None:
    lt = sub.add_parser("loadtest", help="load a running serve (loopback) and check every answer against offline generate")
    add_decode_flags(lt, json_flag=False)
    lt.add_argument("--url", required=True, help="the server's HTTP endpoint, http://127.0.0.1:PORT (loopback only)")
    lt.add_argument("--concurrency", default="1,2,4,8,16,32", help="comma-separated client counts, one level each")
    lt.add_argument("--requests", type=int, default=32, help="requests per level (the same ones at every level)")
    lt.add_argument("--stream", action="store_true", help="stream (dllm_stream /generate_stream) and time the first token")
    lt.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take")
    lt.add_argument("--time-limit", type=float, default=600.0, help="no request starts after this many seconds")
    add_json_flags(lt, "the levels")
    lt.set_defaults(func=run)


def run(a) -> int:
    from ..serving import loadtest as lt
    json_outputs(a)
    host, port = lt.check_url(a.url)
    levels = csv_list(a.concurrency, int)
    if not levels or not all(1 <= c <= 256 for c in levels):
        raise UserError(f"--concurrency {a.concurrency}: expected numbers in 1..256")
    if not 1 <= a.requests <= lt.MAX_REQUESTS:
        raise UserError(f"--requests {a.requests}: expected 1..{lt.MAX_REQUESTS}")
    if not a.artifact:
        raise UserError("--artifact: the artifact the server serves (the offline references come from it)")
    lt.wait_ready(host, port, timeout=a.timeout)
    rt = runtime(a)
    defaults, _ = serve_defaults(a, rt)
    advance = progress(a.requests, "offline references", enabled=sys.stderr.isatty())
    requests = lt.specs(a.requests, defaults, sampling=rt.backend.sample_pool is not None)
    refs = lt.references(rt, requests, defaults, log=lambda msg: advance())
    levels_out = lt.loadtest(host, port, requests, refs, levels, a.stream, a.timeout, a.time_limit,
                             log=lambda msg: print(f"dllm-deploy: {msg}", file=sys.stderr, flush=True))
    ok = all(lt.passed(lv) for lv in levels_out)
    doc = {"url": a.url, "stream": a.stream, "decode": defaults, "passed": ok, "levels": levels_out}
    if a.json_out:
        write_file(Path(a.json_out), json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc) if a.json else lt.table(levels_out))
    if not ok:
        print(f"dllm-deploy: loadtest failed: lost or corrupted responses (see the {'JSON' if a.json else 'table'}; corrupted answers differ from "
              "offline generate: give loadtest the decode flags serve runs with)", file=sys.stderr)
    return 0 if ok else 1
