"""``dllm-deploy loadtest``: closed-loop load against a running ``dllm-deploy serve``, checked.

At each concurrency level C, C client threads send the same N requests (eval-suite prompts; every
other one sampled with its own seed when the artifact samples) as fast as answers come back. Every
answer is compared with the offline ``generate`` of the same prompt and row options, computed here
from the artifact with the server's decode flags before any load is sent: an answer that differs
is *corrupted*, a request without an answer (HTTP error, timeout, broken connection) is an *error*.
The run passes when there are none of either and every request was sent.

Bounded: loopback servers only, at most ``MAX_REQUESTS`` requests per level, each with its own
timeout, and no request starts after the run's time limit.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import numpy as np

from ..errors import UserError
from ..runtime.api import row_options

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_REQUESTS = 10000
SAMPLED = {"temperature": 0.7, "top_p": 0.9}     # the sampled requests' options (seed: the request's index)


def check_url(url: str) -> tuple[str, int]:
    """(host, port) of a loopback http URL, else UserError: a load test never leaves this machine."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise UserError(f"--url {url}: expected http://127.0.0.1:PORT")
    if parts.hostname not in LOOPBACK:
        raise UserError(f"--url {url}: loadtest targets loopback only ({', '.join(LOOPBACK)}), not {parts.hostname}")
    return parts.hostname, parts.port


@dataclass(frozen=True)
class Spec:
    """One request: the JSON body sent and the row options offline generate gets for it."""
    body: dict
    row: object


def specs(n: int, defaults: dict, sampling: bool) -> list[Spec]:
    """n requests over the eval split's prompts (families interleaved); odd ones sampled when ``sampling``."""
    from ..evals.tasks import FAMILIES, eval_split
    split = eval_split(families=FAMILIES)
    pool = [e.prompt for group in zip(*([e for e in split if e.family == f] for f in FAMILIES)) for e in group]
    prompts = [pool[i % len(pool)] for i in range(n)]
    base = row_options(**defaults)
    out = []
    for i, prompt in enumerate(prompts):
        if sampling and i % 2:
            out.append(Spec({"text_input": prompt, **SAMPLED, "seed": i}, replace(base, **SAMPLED, seed=i)))
        else:
            out.append(Spec({"text_input": prompt}, base))
    return out


def references(runtime, requests: list[Spec], defaults: dict, log=lambda msg: None) -> list:
    """The offline RowResult of each request, one generate call per prompt."""
    out = []
    for i, s in enumerate(requests):
        out.append(runtime.generate([s.body["text_input"]], rows=[s.row], **defaults)[0])
        log(f"offline references: {i + 1}/{len(requests)}")
    return out


@dataclass
class Outcome:
    latency: float | None = None
    ttft: float | None = None
    text: str = ""
    token_ids: tuple = ()
    forwards: int = -1
    error: str | None = None


def _ids(value) -> list[int]:
    return np.atleast_1d(value).astype(int).tolist()


def send(host: str, port: int, spec: Spec, stream: bool, timeout: float) -> Outcome:
    """One request over HTTP (``/generate`` of model dllm, or ``/generate_stream`` of dllm_stream:
    server-sent events read as they come, the first one with tokens timing the first token)."""
    start = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    path = "/v2/models/dllm_stream/generate_stream" if stream else "/v2/models/dllm/generate"
    body = {**spec.body, "stream": True} if stream else spec.body
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return Outcome(error=f"HTTP {resp.status}: {resp.read().decode(errors='replace')[:300]}")
        if not stream:
            data = json.loads(resp.read())
            return Outcome(time.monotonic() - start, None, data["text_output"], tuple(_ids(data["token_ids"])),
                           int(np.asarray(data["forwards"]).reshape(-1)[0]))
        out = Outcome()
        text, ids = [], []
        for line in resp:
            if time.monotonic() - start > timeout:
                return Outcome(error=f"no end of stream within {timeout:g} s")
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                return Outcome(error=f"stream error: {event['error']}")
            text.append(event["text_output"])
            ids.extend(_ids(event["token_ids"]))
            if out.ttft is None and len(ids):
                out.ttft = time.monotonic() - start
            if event["finish_reason"]:
                return replace(out, latency=time.monotonic() - start, text="".join(text), token_ids=tuple(ids),
                               forwards=int(np.asarray(event["forwards"]).reshape(-1)[0]))
        return Outcome(error="the stream ended without a last chunk")
    except (OSError, http.client.HTTPException, ValueError) as e:
        return Outcome(error=f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def _matches(o: Outcome, ref) -> bool:
    return o.text == ref.text and list(o.token_ids) == list(ref.token_ids) and o.forwards == ref.forwards


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def run_level(host: str, port: int, requests: list[Spec], refs: list, concurrency: int, stream: bool,
              timeout: float, deadline: float) -> dict:
    """Send every request with ``concurrency`` clients (each sends its next one when its answer is
    in); none starts after ``deadline`` (time.monotonic)."""
    outcomes: list[Outcome | None] = [None] * len(requests)
    lock, todo = threading.Lock(), iter(range(len(requests)))

    def client():
        while time.monotonic() < deadline:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            outcomes[i] = send(host, port, requests[i], stream, timeout)

    start = time.monotonic()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    done = [(o, r) for o, r in zip(outcomes, refs) if o is not None]
    ok = [o for o, _ in done if o.error is None]
    errors = [o.error for o, _ in done if o.error is not None]
    corrupted = sum(1 for o, r in done if o.error is None and not _matches(o, r))
    latencies, ttfts = [o.latency for o in ok], [o.ttft for o in ok if o.ttft is not None]
    return {"concurrency": concurrency, "requests": len(requests), "sent": len(done), "answered": len(ok),
            "errors": len(errors), "error_examples": sorted(set(errors))[:3], "corrupted": corrupted,
            "wall_s": wall, "requests_per_s": len(ok) / wall, "tokens_per_s": sum(len(o.token_ids) for o in ok) / wall,
            "latency_p50_s": _pct(latencies, 50), "latency_p99_s": _pct(latencies, 99),
            "ttft_p50_s": _pct(ttfts, 50), "ttft_p99_s": _pct(ttfts, 99)}


def passed(level: dict) -> bool:
    """Zero lost (every request sent and answered) and zero corrupted."""
    return level["sent"] == level["requests"] and level["errors"] == 0 and level["corrupted"] == 0


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def table(levels: list[dict]) -> str:
    """The load table (markdown)."""
    lines = ["| concurrency | requests | errors | corrupted | req/s | tokens/s | p50 ms | p99 ms | TTFT p50 ms | TTFT p99 ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for lv in levels:
        lost = lv["requests"] - lv["sent"]
        lines.append(f"| {lv['concurrency']} | {lv['answered']}/{lv['requests']}{f' ({lost} not sent)' if lost else ''} "
                     f"| {lv['errors']} | {lv['corrupted']} | {lv['requests_per_s']:.2f} | {lv['tokens_per_s']:.1f} "
                     f"| {_ms(lv['latency_p50_s'])} | {_ms(lv['latency_p99_s'])} | {_ms(lv['ttft_p50_s'])} "
                     f"| {_ms(lv['ttft_p99_s'])} |")
    return "\n".join(lines)


def wait_ready(host: str, port: int, timeout: float) -> None:
    """UserError unless both models answer ready within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            for model in ("dllm", "dllm_stream"):
                conn = http.client.HTTPConnection(host, port, timeout=5)
                try:
                    conn.request("GET", f"/v2/models/{model}/ready")
                    if conn.getresponse().status != 200:
                        raise OSError(f"model {model} is not ready")
                finally:
                    conn.close()
            return
        except (OSError, http.client.HTTPException) as e:
            if time.monotonic() > deadline:
                raise UserError(f"--url http://{host}:{port}: no dllm-deploy server ready there ({e})") from None
            time.sleep(0.5)


def loadtest(host: str, port: int, requests: list[Spec], refs: list, levels: list[int], stream: bool,
             timeout: float, time_limit: float, log=lambda msg: None) -> list[dict]:
    deadline = time.monotonic() + time_limit
    out = []
    for c in levels:
        out.append(run_level(host, port, requests, refs, c, stream, timeout, deadline))
        lv = out[-1]
        log(f"concurrency {c}: {lv['answered']}/{lv['requests']} answered, {lv['errors']} errors, "
            f"{lv['corrupted']} corrupted, {lv['tokens_per_s']:.1f} tokens/s")
    return out
