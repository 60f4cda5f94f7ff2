"""What a bench run is judged by, from its results alone: the quality reference (LLaDA vanilla),
the fastest configuration at equal quality per backend, the headline ratios, the targets of
DESIGN.md with their goals, and ``--tune``'s pick."""
from __future__ import annotations

import statistics

from ..errors import UserError


def quality_reference(runs: list[dict]) -> dict | None:
    """The run whose accuracy is the quality bar: LLaDA vanilla (one token per step) without a
    cache on torch, else vanilla on any backend (every backend decodes the same prompts)."""
    vanilla = [r for r in runs if r["strategy"] == "vanilla" and not r.get("temperature")]
    order = sorted(vanilla, key=lambda r: (r["backend"] != "torch", r.get("cache") != "none"))
    return order[0] if order else None


def equal_quality(runs: list[dict], budget: float = 0.01) -> dict | None:
    """Per backend, the fastest greedy configuration whose accuracy is within ``budget`` (0.01: one
    point) of the vanilla reference's, and its tokens/s over LLaDA vanilla no-cache on torch."""
    ref = quality_reference(runs)
    if ref is None:
        return None
    llada = _best(runs, backend="torch", strategy="vanilla", cache="none")
    per = {}
    for be in sorted({r["backend"] for r in runs}):
        ok = [r for r in runs if r["backend"] == be and not r.get("temperature")
              and r["accuracy"] >= ref["accuracy"] - budget - 1e-9]
        if not ok:
            continue
        pick = max(ok, key=lambda r: r["tokens_per_s"])
        fastest = max((r for r in runs if r["backend"] == be and not r.get("temperature")), key=lambda r: r["tokens_per_s"])
        per[be] = {"pick": pick["label"], "accuracy": pick["accuracy"], "tpf": pick["tpf"], "tokens_per_s": pick["tokens_per_s"],
                   "vs_llada": pick["tokens_per_s"] / llada["tokens_per_s"] if llada else None,
                   "any_quality_pick": fastest["label"], "any_quality_accuracy": fastest["accuracy"],
                   "any_quality_vs_llada": fastest["tokens_per_s"] / llada["tokens_per_s"] if llada else None}
    return {"reference": ref["label"], "reference_accuracy": ref["accuracy"], "budget": budget,
            "llada": llada["label"] if llada else None, "backends": per}


def ratios(runs: list[dict]) -> dict:
    """ORT over torch, and C++ over Python ORT, for every configuration both backends ran."""
    by = {r["label"]: r for r in runs}
    out = {}
    for r in runs:
        for num, den in (("ort", "torch"), ("cpp", "ort")):
            twin = r["label"].replace(f"{num}:", f"{den}:", 1)
            if r["backend"] == num and twin in by:
                out[f"{r['label']} / {den}"] = r["tokens_per_s"] / by[twin]["tokens_per_s"]
    return out


def _best(runs, **match):
    rows = [r for r in runs if all(r.get(k) == v for k, v in match.items()) and not r.get("temperature")]
    return max(rows, key=lambda r: r["tokens_per_s"]) if rows else None


def targets(res: dict) -> list[dict]:
    """The issue's four targets, each with what was measured and whether it is met."""
    runs = res["runs"]
    out = []

    def add(name, target, value, ok, note):
        out.append({"target": name, "goal": target, "measured": value, "met": bool(ok) if value is not None else None,
                    "note": note})

    spd_ort = _best(runs, backend="ort", strategy="spd")
    vanilla_torch = _best(runs, backend="torch", strategy="vanilla", cache="none")
    eq = res.get("equal_quality") or equal_quality(runs)
    ort_eq = (eq or {}).get("backends", {}).get("ort")
    if ort_eq and ort_eq["vs_llada"] is not None:
        v = ort_eq["vs_llada"]
        add("Equal quality (accuracy within 1 point of vanilla) on ONNX Runtime vs LLaDA vanilla no-cache on torch",
            ">= 30x", v, v >= 30, f"{ort_eq['pick']} (accuracy {ort_eq['accuracy']:.3f}) vs {eq['llada']} "
            f"(reference {eq['reference']}, accuracy {eq['reference_accuracy']:.3f})")
    else:
        add("Equal quality on ONNX Runtime vs LLaDA vanilla no-cache on torch", ">= 30x", None, None,
            "needs --backends torch,ort and --strategies vanilla,...")
    if spd_ort and vanilla_torch:
        v = spd_ort["tokens_per_s"] / vanilla_torch["tokens_per_s"]
        add("Fastest SPD on ONNX Runtime (any quality) vs LLaDA vanilla no-cache on torch", ">= 30x", v, v >= 30,
            f"{spd_ort['label']} (accuracy {spd_ort['accuracy']:.3f}) vs {vanilla_torch['label']}")
    rs = {k: v for k, v in res["ratios"].items() if ":spd" in k and k.endswith("/ torch")}
    if rs:
        med = statistics.median(rs.values())
        add("ONNX Runtime vs torch eager, same strategy (SPD, median over configurations)", ">= 1.5x", med, med >= 1.5,
            f"min {min(rs.values()):.2f}x, max {max(rs.values()):.2f}x over {len(rs)} SPD configurations")
    else:
        add("ONNX Runtime vs torch eager, same strategy", ">= 1.5x", None, None, "needs both backends and spd")
    lossless = _best(runs, backend="ort", strategy="spd", select="lossless", base="threshold")
    thr = _best(runs, backend="ort", strategy="threshold")
    if lossless and thr:
        v = lossless["tokens_per_s"] / thr["tokens_per_s"]
        add("SPD lossless vs threshold, tokens/s on this device (best W)", ">= 1.0x", v, v >= 1.0,
            f"{lossless['label']} vs {thr['label']}")
        m = lossless["modelled_tokens_per_s_memory_bound"] / thr["modelled_tokens_per_s_memory_bound"]
        add("SPD lossless vs threshold, modelled memory-bound gain (TPF ratio)", ">= 2x", m, m >= 2.0,
            "modelled: every forward costs as much as a one-branch forward")
    else:
        add("SPD lossless vs threshold", ">= 1.0x measured, >= 2x modelled", None, None,
            "needs --strategies threshold,spd on ort")
    if spd_ort:
        add("Loop overhead of SPD on ONNX Runtime", "<= 10%", spd_ort["loop_overhead"], spd_ort["loop_overhead"] <= 0.10,
            spd_ort["label"])
    return out


def tune(res: dict, backend: str = "ort", quality_budget: float = 0.01) -> dict:
    """The decode configuration (strategy, W, tau, mode) with the best measured tokens/s on
    ``backend`` whose accuracy is within ``quality_budget`` (0.01: one point) of the vanilla
    reference's (``quality_reference``): the fastest at equal quality. ``baseline`` is the fastest
    threshold run at that quality (the pick itself when there is none)."""
    ref = quality_reference(res["runs"])
    if ref is None:
        raise UserError("--tune needs the vanilla reference in the run (--strategies vanilla,threshold,spd)")
    runs = [r for r in res["runs"] if r["backend"] == backend and not r.get("temperature")]   # greedy runs only
    ok = [r for r in runs if r["accuracy"] >= ref["accuracy"] - quality_budget - 1e-9]
    if not ok:
        raise UserError(f"no {backend} configuration is within {quality_budget} of the reference's accuracy "
                        f"({ref['label']}, {ref['accuracy']:.3f})")
    pick = max(ok, key=lambda r: r["tokens_per_s"])
    base = max((r for r in ok if r["strategy"] == "threshold"), key=lambda r: r["tokens_per_s"], default=pick)
    return {"pick": pick, "baseline": base, "reference": ref, "quality_budget": quality_budget,
            "speedup_vs_threshold": pick["tokens_per_s"] / base["tokens_per_s"]}
