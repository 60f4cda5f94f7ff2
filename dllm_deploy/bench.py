"""``dllm-deploy bench``: strategies x beam widths x thresholds x backends, measured in one run.

Configurations are interleaved (A B C A B C ...) so that ratios hold on a noisy machine; each
figure is the median over repeats (min and max are kept). Time spent inside backend calls is
measured per run, so the loop's own overhead is reported as a share of wall time.
"""
from __future__ import annotations

import itertools
import platform
import statistics
import time
from dataclasses import dataclass

from .errors import UserError


class TimedBackend:
    """Wraps a backend and accumulates the seconds spent inside its calls."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0
        self.name, self.topk = inner.name, inner.topk

    def new_cache(self, *a):
        return self.inner.new_cache(*a)

    def _timed(self, fn, *a):
        t0 = time.perf_counter()
        try:
            return fn(*a)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1

    def prefill(self, *a):
        return self._timed(self.inner.prefill, *a)

    def verify(self, *a):
        return self._timed(self.inner.verify, *a)


@dataclass(frozen=True)
class Config:
    backend: str
    strategy: str
    beam_width: int = 1
    threshold: float = 0.9
    select: str = "lossless"
    base: str = "vanilla"

    @property
    def label(self) -> str:
        if self.strategy == "spd":
            extra = f" W{self.beam_width} {self.select}" + (f"/{self.base}" if self.select == "lossless" else "")
            if self.select == "threshold" or self.base == "threshold":
                extra += f" tau{self.threshold}"
        elif self.strategy == "threshold":
            extra = f" tau{self.threshold}"
        else:
            extra = ""
        return f"{self.backend}:{self.strategy}{extra}"


def configurations(backends, strategies, beam_widths, thresholds) -> list[Config]:
    out = []
    for be in backends:
        for s in strategies:
            if s == "vanilla":
                out.append(Config(be, "vanilla"))
            elif s == "threshold":
                out += [Config(be, "threshold", threshold=t) for t in thresholds]
            elif s == "spd":
                for w in beam_widths:
                    out.append(Config(be, "spd", beam_width=w, base="vanilla"))
                    out += [Config(be, "spd", beam_width=w, base="threshold", threshold=t) for t in thresholds]
                    out += [Config(be, "spd", beam_width=w, select="threshold", threshold=t) for t in thresholds]
            else:
                raise UserError(f"unknown strategy {s!r}")
    return out


def machine_facts() -> dict:
    import os
    return {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version()}


def versions() -> dict:
    import importlib.metadata as md
    out = {}
    for pkg in ("dllm-deploy", "numpy", "onnxruntime", "onnx", "torch"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def run_bench(artifact: str, backends=("torch", "ort"), strategies=("vanilla", "threshold", "spd"),
              beam_widths=(1, 2, 4, 8), thresholds=(0.9,), families=None, n: int = 5, repeats: int = 3,
              gen_length: int = 256, progress=None) -> dict:
    from .evals import tasks
    from .evals.harness import run_eval
    from .runtime.api import Runtime, decode_config
    from .runtime.loop import Decoder

    families = tuple(families or tasks.FAMILIES)
    ort_rt = Runtime.load(artifact=artifact)
    runtimes = {}
    for be in backends:
        if be == "ort":
            runtimes[be] = ort_rt
        elif be == "torch":
            runtimes[be] = Runtime.load(model=ort_rt.backend.manifest.get("source", "tiny"), device="cpu")
        else:
            raise UserError(f"unknown backend {be!r} (expected torch or ort)")
    configs = configurations(backends, strategies, beam_widths, thresholds)
    samples: dict[Config, list[dict]] = {c: [] for c in configs}
    for _, c in itertools.product(range(repeats), configs):
        rt = runtimes[c.backend]
        timed = TimedBackend(rt.backend)
        dec = Decoder(timed, rt.tokenizer, rt.config, max_beam_width=rt.decoder.max_beam_width)
        kw = dict(strategy=c.strategy, threshold=c.threshold, gen_length=gen_length)
        if c.strategy == "spd":
            kw.update(beam_width=c.beam_width, select=c.select, base=c.base, tree="wide" if c.beam_width >= 4 else "chain")
        t0 = time.perf_counter()
        res = run_eval(dec, decode_config(**kw), families=families, n=n)
        wall = time.perf_counter() - t0
        o = res["overall"]
        samples[c].append({"accuracy": o["accuracy"], "tpf": o["tpf"], "forwards": o["forwards"], "tokens": o["tokens"],
                           "wall_s": wall, "tokens_per_s": o["tokens"] / wall,
                           "time_per_forward_ms": 1000 * timed.seconds / max(timed.calls, 1),
                           "loop_overhead": max(0.0, 1 - timed.seconds / wall)})
        if progress:
            progress(1)
    runs = []
    for c, ss in samples.items():
        med = {k: statistics.median(s[k] for s in ss) for k in ss[0]}
        runs.append({"label": c.label, "backend": c.backend, "strategy": c.strategy, "beam_width": c.beam_width,
                     "threshold": c.threshold, "select": c.select, "base": c.base, **med,
                     "tokens_per_s_min": min(s["tokens_per_s"] for s in ss),
                     "tokens_per_s_max": max(s["tokens_per_s"] for s in ss), "repeats": len(ss)})
    by = {r["label"]: r for r in runs}
    ratios = {}
    for r in runs:
        if r["backend"] == "ort" and r["label"].replace("ort:", "torch:") in by:
            ratios[f"{r['label']} / torch"] = r["tokens_per_s"] / by[r["label"].replace("ort:", "torch:")]["tokens_per_s"]
    return {"machine": machine_facts(), "versions": versions(), "artifact": artifact, "families": list(families),
            "prompts_per_family": n, "repeats": repeats, "gen_length": gen_length, "runs": runs, "ratios": ratios}
