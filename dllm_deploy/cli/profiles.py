"""``dllm-deploy profiles``: list, show or explain device profiles."""
from __future__ import annotations

import json

from ..errors import UserError


def add_parser(sub) -> None:
    pr = sub.add_parser("profiles", help="list, show or explain device profiles")
    pr.add_argument("action", choices=["list", "show", "explain"])
    pr.add_argument("name", nargs="?", default=None, help="profile name or 'auto'")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=run)


def run(a) -> int:
    import dataclasses

    from ..profiles import detect, explain, get_profile, load_profiles, notes
    from ..profiles.memory import free_bytes_for
    profiles = load_profiles()
    if a.action == "list":
        profiles.warn_broken()
        rows = [{"name": p.name, "description": p.description} for p in profiles.values()]
        print(json.dumps(rows) if a.json else "\n".join(f"{r['name']:<18} {r['description']}" for r in rows))
        return 0
    if not a.name:
        raise UserError(f"profiles {a.action} needs a profile name (or 'auto')")
    prof, reasons, facts = get_profile(a.name, profiles)
    if a.action == "show":
        d = dataclasses.asdict(prof)
        print(json.dumps(d) if a.json else yaml_dump(d))
        return 0
    facts = facts or detect()
    others = explain(profiles, facts)["candidates"] if a.name == "auto" else []
    free, where = free_bytes_for(prof, facts, on_gpu=prof.match["kind"] != "cpu" and facts.get("kind") != "cpu")
    budget = prof.memory.get("fraction", 0.5) * free - prof.memory.get("reserve_mb", 512) * 2**20
    out = {"profile": prof.name, "source": prof.source, "facts": facts, "reasons": reasons,
           "backends": prof.backends, "precision": prof.precision, "decode": prof.decode, "device": prof.device,
           "memory": {"free_gb": free / 2**30, "free_from": where, "budget_gb": budget / 2**30, **prof.memory},
           "candidates": others, "tuned": prof.tuned, "notes": notes(facts)}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"profile {prof.name} ({prof.source})")
        print("device: " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in facts.items()))
        for r in reasons:
            print(f"  matched: {r}")
        for c in (c for c in others if c["score"] is not None):
            print(f"  also matched: {c['name']} (score {c['score']}, priority {c['priority']}): {'; '.join(c['reasons'])}")
        if others:
            print(f"  did not match: {sum(c['score'] is None for c in others)} other profiles")
        print(f"backends: {' > '.join(prof.backends)}; precision {prof.precision}; decode {prof.decode}")
        if prof.tuned:
            t = prof.tuned
            print(f"decode defaults from `bench --tune` ({t.get('date', '?')}, on top of {t.get('base_profile', '?')}): "
                  f"{t.get('pick', '?')}, {t.get('speedup_vs_threshold', '?')}x the threshold baseline; "
                  f"measurements in {t.get('from', '?')}")
        print(f"memory budget: {prof.memory.get('fraction', 0.5)} x {free / 2**30:.1f} GB free ({where}) "
              f"- {prof.memory.get('reserve_mb', 512)} MB = {budget / 2**30:.1f} GB")
        for note in out["notes"]:
            print(f"note: {note}")
    return 0


def yaml_dump(d: dict) -> str:
    import yaml
    return yaml.safe_dump(d, sort_keys=False).rstrip()
