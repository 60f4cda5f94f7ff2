"""``dllm-deploy bench``: strategies x beam widths x thresholds x backends, measured in one run.

Configurations are interleaved (A B C A B C ...) so that ratios hold on a noisy machine; each
figure is the median over repeats (min and max are kept). Time spent inside backend calls is
measured per run, so the loop's own overhead is reported as a share of wall time.

Every decode is a stream (``generate`` is the stream collected): ``ChunkClock`` times each
row's chunks, and every run reports the time to first token and the time between chunks that
carry tokens (p50 / p99 over every row of every repeat).

Besides the decode runs, the bench measures each backend's **forward cost curve** (time of one
verification forward against the tokens it carries, W * L) and derives, for every run, the
tokens/s its measured TPF would give if a forward cost as much as a one-branch forward (the
memory-bound regime of a GPU at small token counts). That figure is *modelled*, and labelled so.

The baselines (DESIGN §2): ``vanilla`` is LLaDA's generate as its users run it (one token per
step, no KV cache: one full forward per token); ``threshold`` is Fast-dLLM's parallel decoding
with the prefix cache (exact for a block-causal model); ``spd`` runs lossless selection over the
vanilla and threshold bases and the lossy threshold mode.
"""
from __future__ import annotations

import itertools
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..options import PROFILE_DEFAULT_KEYS
from ..errors import UserError
from ..runtime.tree import DEFAULT_TREE
from .cpp import cpp_binary, run_cpp
from .targets import equal_quality, ratios, targets

STRATEGY_NAMES = ("vanilla", "vanilla-cache", "threshold", "spd")
SAMPLING = {"temperature": 0.7, "top_p": 0.9}    # the sampling runs beside the greedy ones (bench --seeds)


class TimedBackend:
    """Wraps a backend and accumulates the seconds spent inside its calls and the tokens they fed."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls, self.fed = inner, 0.0, 0, 0
        self.name, self.topk = inner.name, inner.topk
        self.capabilities = inner.capabilities
        self.sample_pool, self.folder = inner.sample_pool, getattr(inner, "folder", inner.name)

    def new_cache(self, *a):
        return self.inner.new_cache(*a)

    def _timed(self, fn, *a):
        self.fed += a[1].size                  # (B,T) ids: every row's tokens, pads included
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


class ChunkClock:
    """Times the chunks of decode calls: each row's time to first token, and the gaps between its
    chunks that carry token ids (seconds). ``around(runtime)`` is a runtime for run_eval."""

    def __init__(self):
        self.ttft, self.gaps = [], []

    def around(self, runtime) -> SimpleNamespace:
        """``runtime`` as run_eval reads it (generate, backend), its calls timed."""
        return SimpleNamespace(generate=partial(self.generate, runtime), backend=runtime.backend)

    def generate(self, runtime, prompts, rows=None, config=None):
        last: dict[int, float] = {}

        def tick(chunk: dict) -> None:
            if chunk["token_ids"]:
                now = time.perf_counter()
                if chunk["index"] in last:
                    self.gaps.append(now - last[chunk["index"]])
                last[chunk["index"]] = now
        results = runtime.generate(prompts, rows, on_chunk=tick, config=config)
        self.ttft += [r.time_to_first_token_s for r in results if r.time_to_first_token_s is not None]
        return results

    def percentiles(self) -> dict:
        """ttft_ms_p50/p99 and chunk_gap_ms_p50/p99 (None where nothing was measured: the C++ runs)."""
        out = {}
        for name, xs in (("ttft", self.ttft), ("chunk_gap", self.gaps)):
            for q in (50, 99):
                out[f"{name}_ms_p{q}"] = float(1000 * np.percentile(xs, q)) if xs else None
        return out


@dataclass(frozen=True)
class Config:
    backend: str
    strategy: str                 # vanilla | threshold | spd
    beam_width: int = 1
    threshold: float = 0.9
    threshold_floor: float | None = None   # threshold rule: dynamic tau down to this floor
    threshold_far: float | None = None     # threshold rule: tau past the first masked position below tau
    threshold_lead: float | None = None    # threshold rule: tau of the leftmost masked position
    select: str = "lossless"
    base: str = "vanilla"
    cache: str = "auto"           # vanilla baseline: none (LLaDA recomputes everything)
    tree: str = DEFAULT_TREE
    temperature: float = 0.0      # > 0: a sampling run (SAMPLING's top-p, this seed)
    seed: int = 0
    precision: str = "fp32"       # the artifact's variant (ort, cpp)

    @property
    def label(self) -> str:
        if self.strategy == "spd":
            extra = f" W{self.beam_width} {self.select}" + (f"/{self.base}" if self.select == "lossless" else "")
            if self.select == "threshold" or self.base == "threshold":
                extra += f" tau{self.threshold}"
            if self.tree != DEFAULT_TREE:
                extra += f" {self.tree}"
        elif self.strategy == "threshold":
            extra = f" tau{self.threshold}" + (f">{self.threshold_floor}" if self.threshold_floor else "")
            extra += f" far{self.threshold_far}" if self.threshold_far else ""
            extra += f" lead{self.threshold_lead}" if self.threshold_lead is not None else ""
        else:
            extra = " no-cache" if self.cache == "none" else ""
        if self.cache not in ("auto", "none"):
            extra += f" {self.cache}"
        if self.temperature > 0:
            extra += f" T{self.temperature} p{SAMPLING['top_p']} seed{self.seed}"
        if self.precision != "fp32":
            extra += f" {self.precision}"
        return f"{self.backend}:{self.strategy}{extra}"

    @property
    def row(self):
        """The RowOptions of a sampling run (None: greedy)."""
        from ..runtime.rows import RowOptions
        return RowOptions(temperature=self.temperature, top_p=SAMPLING["top_p"], seed=self.seed) if self.temperature else None

    def decode_kwargs(self, gen_length: int) -> dict:
        kw = {"strategy": self.strategy, "threshold": self.threshold, "gen_length": gen_length, "cache": self.cache}
        if self.threshold_floor:
            kw["threshold_floor"] = self.threshold_floor
        if self.threshold_far:
            kw["threshold_far"] = self.threshold_far
        if self.threshold_lead is not None:
            kw["threshold_lead"] = self.threshold_lead
        if self.strategy == "spd":
            kw.update(beam_width=self.beam_width, select=self.select, base=self.base, tree=self.tree)
        if self.temperature > 0:
            kw.update(temperature=self.temperature, top_p=SAMPLING["top_p"], seed=self.seed)
        return kw


def split_backend(item: str) -> tuple[str, list[str] | None]:
    """``"ort"`` -> ("ort", None); ``"torch:vanilla+threshold"`` -> ("torch", [...]): a backend that
    runs only those strategies (e.g. torch as the LLaDA baseline only)."""
    name, _, only = item.partition(":")
    return name, (only.split("+") if only else None)


def configurations(backends, strategies, beam_widths, thresholds, tree: str = DEFAULT_TREE, seeds=(),
                   threshold_floors=(), threshold_fars=(), threshold_leads=(), precisions=("fp32",),
                   caches=("auto",)) -> list[Config]:
    """Every greedy configuration, each threshold one once per cache mode in ``caches`` (``auto``:
    the model's exact or prefix cache; e.g. ``delayed``), each ONNX Runtime one (ort, cpp) once per
    precision variant in ``precisions``, then (``seeds``) each cached one again sampling with each seed.
    ``threshold_floors``: the threshold rule again with a dynamic tau from each threshold down to
    each floor below it; ``threshold_fars``: again with each far threshold at or above it (the
    positions past the first uncertain one need that confidence); ``threshold_leads``: again with
    each lead threshold below it (the leftmost masked position's bar), with each far threshold at or
    above it, or alone where there is none. A backend written ``NAME:S1+S2`` runs only strategies S1, S2."""
    out = []
    for item in backends:
        be, only = split_backend(item)
        for s in (only or strategies):
            if s == "vanilla":
                out.append(Config(be, "vanilla", cache="none"))
            elif s == "vanilla-cache":
                out.append(Config(be, "vanilla"))
            elif s == "threshold":
                out += [Config(be, "threshold", threshold=t) for t in thresholds]
                out += [Config(be, "threshold", threshold=t, threshold_floor=f) for t in thresholds
                        for f in threshold_floors if f < t]
                out += [Config(be, "threshold", threshold=t, threshold_far=f) for t in thresholds
                        for f in threshold_fars if f >= t]
                out += [Config(be, "threshold", threshold=t, threshold_far=f, threshold_lead=lead) for t in thresholds
                        for f in ([x for x in threshold_fars if x >= t] or [None])
                        for lead in threshold_leads if lead < t]
            elif s == "spd":
                for w in beam_widths:
                    if w < 1:
                        raise UserError(f"beam width must be >= 1, got {w}")
                    out.append(Config(be, "spd", beam_width=w, base="vanilla", tree=tree))
                    out += [Config(be, "spd", beam_width=w, base="threshold", threshold=t, tree=tree) for t in thresholds]
                    out += [Config(be, "spd", beam_width=w, select="threshold", threshold=t, tree=tree) for t in thresholds]
            else:
                raise UserError(f"unknown strategy {s!r} (expected some of {', '.join(STRATEGY_NAMES)})")
    threshold = [c for c in out if c.strategy == "threshold"]
    out = [c for c in out if c.strategy != "threshold" or "auto" in caches]
    out += [replace(c, cache=m) for m in caches if m != "auto" for c in threshold]
    out += [replace(c, precision=p) for p in precisions if p != "fp32" for c in list(out) if c.backend in ("ort", "cpp")]
    return out + [replace(c, temperature=SAMPLING["temperature"], seed=s) for s in seeds for c in out if c.cache != "none"]


def machine_facts() -> dict:
    return {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "processor": _cpu_model()}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def versions() -> dict:
    import importlib.metadata as md
    out = {}
    for pkg in ("dllm-deploy", "numpy", "onnxruntime", "onnx", "torch"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def cost_prefix(max_seq: int, block_length: int, gen_length: int) -> int:
    """Cached prefix for the forward-cost curve: a prompt plus half the generation. The W branches
    share the block's L positions (tree verification), so the context bounds it at max_seq - L
    whatever W is (bounding it by max_seq - W*L left no prefix at all at W=16, L=32, max_seq=512)."""
    return min(max_seq - block_length, 64 + gen_length // 2)


class CostProbe:
    """One verification forward of W branches (W * L tokens) after ``prefix`` cached tokens, ready
    to time for each W (prefilled and warmed up once)."""

    def __init__(self, backend, config, widths, block_length: int, prefix: int):
        from ..models.masks import tree_mask, tree_positions
        rng = np.random.default_rng(0)
        self.backend, self.widths, self.block_length, self.prefix = backend, list(widths), block_length, prefix
        self.cache = backend.new_cache(1, prefix + block_length)
        ids = rng.integers(32, 127, size=(1, prefix), dtype=np.int64)
        pos = np.arange(prefix, dtype=np.int64)[None]
        backend.prefill(self.cache, ids, pos, np.ones((1, 1, prefix, prefix), dtype=bool), prefix)
        self.times: dict[int, list[float]] = {w: [] for w in widths}
        self.feeds = {}
        for w in widths:
            n = w * block_length
            self.feeds[w] = (np.full((1, n), config.mask_token_id, dtype=np.int64),
                             tree_positions(prefix, block_length, w)[None].astype(np.int64),
                             tree_mask(prefix, block_length, w)[None, None])
            backend.verify(self.cache, *self.feeds[w])                # warm-up (allocations, kernels)

    def once(self) -> None:
        """Time one forward at every width (widths interleaved)."""
        for w in self.widths:
            t0 = time.perf_counter()
            self.backend.verify(self.cache, *self.feeds[w])
            self.times[w].append(time.perf_counter() - t0)

    def result(self) -> list[dict]:
        return [{"beam_width": w, "tokens": w * self.block_length, "prefix": self.prefix,
                 "ms": 1000 * statistics.median(t), "ms_min": 1000 * min(t), "ms_max": 1000 * max(t)}
                for w, t in self.times.items()]


def forward_cost(backend, config, widths, block_length: int, prefix: int, repeats: int = 5) -> list[dict]:
    """Median time of one verification forward of W branches (W * L tokens) after a prefix of
    ``prefix`` cached tokens, for each W. Widths are interleaved across repeats."""
    probe = CostProbe(backend, config, widths, block_length, prefix)
    for _ in range(repeats):
        probe.once()
    return probe.result()


def compare_cost(artifacts: dict, widths, block_length: int, prefix: int, repeats: int = 5,
                 precisions=("fp32",)) -> dict:
    """The ONNX Runtime forward cost of several artifacts (label -> folder) in one run, each width
    and artifact interleaved in every repeat, with each one's parameters and active parameters
    (profiles/memory.py: a mixture counts k experts a token, not E): the comparison of a
    mixture-of-experts model with a dense model of its active size (docs/moe.md)."""
    from ..profiles.memory import active_param_count, param_count
    from ..runtime.api import Runtime
    probes, facts = {}, {}
    for label, folder in artifacts.items():
        for p in precisions:
            rt = Runtime.load(artifact=str(folder), precision=p)
            probes[label, p] = CostProbe(rt.backend, rt.config, widths, block_length, prefix)
            facts[label] = {"artifact": str(folder), "params": param_count(rt.memory_facts()),
                            "active_params": active_param_count(rt.memory_facts()),
                            "experts": rt.backend.manifest.get("experts")}
    for _ in range(repeats):
        for probe in probes.values():
            probe.once()
    out = {label: {**f, "forward_cost": {}} for label, f in facts.items()}
    for (label, p), probe in probes.items():
        rows = probe.result()
        for r in rows:     # microseconds per token per million active parameters: lower is better
            r["us_per_token_per_m_active"] = 1000 * r["ms"] / r["tokens"] / (facts[label]["active_params"] / 1e6)
        out[label]["forward_cost"][p] = rows
    return out


def _peak_memory(artifact: str, widths, block_length: int, prefix: int) -> dict[int, float | None]:
    """Measured peak memory (MB) of ONNX Runtime verification per W, where the profiles' memory
    module offers a measurement; None otherwise."""
    try:
        from .memory import measure_peak_bytes
    except ImportError:
        return {w: None for w in widths}
    out = {}
    for w in widths:
        try:
            m = measure_peak_bytes(artifact, beam_width=w, prefix_len=prefix, block_length=block_length)
            out[w] = m["peak_bytes"] / 2**20
        except Exception:  # noqa: BLE001 -- a failed measurement is a missing cell, not a failed bench
            out[w] = None
    return out


def run_bench(artifact: str, backends=("torch", "ort"), strategies=("vanilla", "threshold", "spd"),
              beam_widths=(1, 2, 4, 8), thresholds=(0.9,), families=None, n: int = 5, repeats: int = 3,
              gen_length: int = 256, tree: str = DEFAULT_TREE, batch_size: int = 1, cost_repeats: int = 5,
              memory: bool = False, device: str = "cpu", progress=None, seeds=(), threshold_floors=(), threshold_fars=(),
              threshold_leads=(), precisions=("fp32",),
              quality_budget: float = 0.01, caches=("auto",), compare: dict | None = None) -> dict:
    from ..evals import tasks
    from ..evals.harness import run_eval
    from ..profiles.memory import estimate_bytes
    from ..runtime.api import Runtime, decode_config

    families = tuple(families or tasks.FAMILIES)
    unknown = [f for f in families if f not in tasks.FAMILIES]
    if unknown:
        raise UserError(f"unknown task family {unknown[0]!r} (expected some of {', '.join(tasks.FAMILIES)})")
    from ..profiles import get_profile
    prof, reasons, _ = get_profile("auto")
    configs = configurations(backends, strategies, beam_widths, thresholds, tree, seeds, threshold_floors, threshold_fars,
                             threshold_leads, precisions, caches)
    backends = list(dict.fromkeys(split_backend(b)[0] for b in backends))
    ort_rt = Runtime.load(artifact=artifact, precision="fp32")
    variants = sorted({c.precision for c in configs} - {"fp32"})
    have = ort_rt.backend.manifest.get("precisions", {})
    missing = [p for p in variants if p not in have]
    if missing:
        raise UserError(f"{artifact}: no {missing[0]} variant (it has {', '.join(have)}): export with "
                        f"--precision fp32,{','.join(missing)}")
    quantized = {p: Runtime.load(artifact=artifact, precision=p) for p in variants}   # only ort / cpp rows have them
    runtimes = {}
    for be in backends:
        if be == "ort":
            runtimes[be] = ort_rt
        elif be == "torch":
            runtimes[be] = Runtime.load(model=ort_rt.backend.manifest.get("source", "tiny"), device=device)
        elif be == "cpp":
            if batch_size != 1:
                raise UserError("backend 'cpp' decodes one prompt at a time: use --batch-size 1")
            runtimes[be] = cpp_binary()
        else:
            raise UserError(f"unknown backend {be!r} (expected some of torch, ort, cpp)")
    if not configs:
        raise UserError("nothing to measure: no strategy selected")
    cap = ort_rt.max_beam_width
    too_wide = [c.beam_width for c in configs if c.beam_width > cap]
    if too_wide:
        raise UserError(f"beam width {max(too_wide)} is over this artifact's cap {cap} (export with a larger --max-beam-width)")
    cfg = ort_rt.config
    L = cfg.block_size or 32

    # forward cost curves (one per backend), before the decode runs
    widths = sorted({1, *[c.beam_width for c in configs]})
    prefix = cost_prefix(cfg.max_seq, L, gen_length)
    # (the C++ runtime runs the same ONNX Runtime graphs: its forwards cost what ORT's do)
    cost = {be: forward_cost(runtimes[be].backend, cfg, widths, L, prefix, cost_repeats) for be in backends if be != "cpp"}
    if "cpp" in backends and "ort" not in cost:
        cost["ort"] = forward_cost(ort_rt.backend, cfg, widths, L, prefix, cost_repeats)
    for p, rt in quantized.items():      # keyed "ort int8": the label's suffix
        cost[f"ort {p}"] = forward_cost(rt.backend, cfg, widths, L, prefix, cost_repeats)
    if progress:
        progress(len(backends) + len(quantized))
    examples = tasks.eval_split(families=families, n=n)

    samples: dict[Config, list[dict]] = {c: [] for c in configs}
    clocks = {c: ChunkClock() for c in configs}
    used_w: dict[Config, int] = {}
    for _, c in itertools.product(range(repeats), configs):
        used_w[c] = min(c.beam_width, cap) if c.strategy == "spd" else 1
        if c.backend == "cpp":
            o = run_cpp(runtimes["cpp"], artifact, examples,
                        {**c.decode_kwargs(gen_length), "precision": None if c.precision == "fp32" else c.precision}, cap)
            samples[c].append({"accuracy": o["accuracy"], "tpf": o["tokens"] / max(o["forwards"], 1), "forwards": o["forwards"],
                               "tokens": o["tokens"], "wall_s": o["wall_s"], "tokens_per_s": o["tokens"] / o["wall_s"],
                               "time_per_forward_ms": 1000 * o["backend_s"] / max(o["forwards"], 1),
                               "loop_overhead": max(0.0, 1 - o["backend_s"] / o["wall_s"])})
            if progress:
                progress(1)
            continue
        rt = quantized[c.precision] if c.precision != "fp32" else runtimes[c.backend]
        timed = TimedBackend(rt.backend)
        dec = Runtime(timed, rt.tokenizer, rt.config, max_beam_width=rt.max_beam_width)
        t0 = time.perf_counter()
        res = run_eval(clocks[c].around(dec), decode_config(**c.decode_kwargs(gen_length)), families=families, n=n,
                       batch_size=batch_size, row=c.row)
        wall = time.perf_counter() - t0
        o = res["overall"]
        samples[c].append({"accuracy": o["accuracy"], "tpf": o["tpf"], "forwards": o["forwards"], "tokens": o["tokens"],
                           "wall_s": wall, "tokens_per_s": o["tokens"] / wall,
                           "time_per_forward_ms": 1000 * timed.seconds / max(timed.calls, 1),
                           "loop_overhead": max(0.0, 1 - timed.seconds / wall),
                           "fed_per_token": timed.fed / max(o["tokens"], 1)})
        if progress:
            progress(1)

    peak = _peak_memory(artifact, widths, L, prefix) if memory else {w: None for w in widths}
    runs = []
    for c, ss in samples.items():
        med = {k: statistics.median(s[k] for s in ss) for k in ss[0]}   # fed_per_token: Python rows only
        w = used_w[c]
        key = ("ort" if c.backend == "cpp" else c.backend) + ("" if c.precision == "fp32" else f" {c.precision}")
        one = next(x["ms"] for x in cost[key] if x["beam_width"] == 1)
        # modelled: every forward costs a one-branch forward (no-cache forwards carry the whole sequence)
        modelled = None if c.cache == "none" else med["tokens"] / (med["forwards"] * one / 1000)
        est = estimate_bytes(ort_rt.memory_facts(), c.precision, batch_size, w, L, cfg.max_seq)
        runs.append({"label": c.label, **asdict(c), "beam_width_used": w, **med, **clocks[c].percentiles(),
                     "tokens_per_s_min": min(s["tokens_per_s"] for s in ss),
                     "tokens_per_s_max": max(s["tokens_per_s"] for s in ss), "repeats": len(ss),
                     "modelled_tokens_per_s_memory_bound": modelled,
                     "memory_estimate_mb": est["total"] / 2**20,
                     "memory_peak_mb": peak.get(w) if c.backend in ("ort", "cpp") and c.precision == "fp32" else None})
    out = {"machine": machine_facts(), "versions": versions(), "profile": {"name": prof.name, "reasons": reasons},
           "artifact": str(artifact), "families": list(families), "prompts_per_family": n, "repeats": repeats,
           "gen_length": gen_length, "batch_size": batch_size, "block_length": L, "tree": tree, "torch_device": device,
           "forward_cost": cost, "runs": runs}
    if compare:
        main = Path(artifact).name if Path(artifact).name not in compare else "artifact"
        out["compare"] = compare_cost({main: artifact, **compare}, widths, L, prefix, cost_repeats, precisions)
    out["ratios"] = ratios(runs)
    out["equal_quality"] = equal_quality(runs, quality_budget)
    out["targets"] = targets(out)
    return out


def overlay_profile(tuned: dict, base_profile, bench_json: str | None) -> dict:
    """A user profile that extends ``base_profile`` with the tuned decode defaults."""
    p = tuned["pick"]
    picked = {**Config(**{f.name: p[f.name] for f in fields(Config) if f.name in p}).decode_kwargs(0), "beam_width": int(p["beam_width_used"])}
    if picked["cache"] == "auto":        # the model's own cache: nothing to write
        del picked["cache"]
    decode = {**base_profile.decode, **{k: picked[k] for k in PROFILE_DEFAULT_KEYS if k in picked}}
    return {"name": f"{base_profile.name}-tuned", "description": f"{base_profile.name} with decode defaults from bench --tune",
            "priority": base_profile.priority + 1, "match": dict(base_profile.match), "backends": list(base_profile.backends),
            "precision": p.get("precision", "fp32"), "decode": decode, "memory": dict(base_profile.memory),
            "ort": dict(base_profile.ort),
            "tuned": {"from": bench_json or "(not saved)", "base_profile": base_profile.name, "pick": p["label"],
                      "tokens_per_s": round(p["tokens_per_s"], 2), "baseline": tuned["baseline"]["label"],
                      "speedup_vs_threshold": round(tuned["speedup_vs_threshold"], 3),
                      "quality_budget": tuned["quality_budget"], "date": time.strftime("%Y-%m-%d")}}
