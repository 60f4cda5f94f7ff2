"""``dllm-deploy build-engines``: TensorRT engines for a profile."""
from __future__ import annotations

import json
import sys


def add_parser(sub) -> None:
    be = sub.add_parser("build-engines", help="build TensorRT engines for a profile (needs TensorRT + a GPU)")
    be.add_argument("--artifact", required=True)
    be.add_argument("--profile", default="auto")
    be.add_argument("--workspace-mb", type=int, default=None, help="TensorRT workspace (default: the profile's trt.workspace_mb)")
    be.add_argument("--opt-level", type=int, default=None, help="TensorRT builder optimization level 0-5 (default: the profile's)")
    be.add_argument("--dry-run", action="store_true", help="print the shapes and the trtexec command; build nothing")
    be.add_argument("--force", action="store_true", help="rebuild even when the recorded engines are up to date")
    be.add_argument("--json", action="store_true")
    be.set_defaults(func=run)


def run(a) -> int:
    from ..artifact import read_manifest
    from ..export.engines import build_engines, plan_engines
    from ..profiles import get_profile
    m = read_manifest(a.artifact, verify=not a.dry_run)
    prof, reasons, _ = get_profile(a.profile)
    plan = plan_engines(a.artifact, m, prof, workspace_mb=a.workspace_mb, opt_level=a.opt_level)
    public = {k: v for k, v in plan.items() if not k.startswith("_")}
    if a.dry_run:
        if a.json:
            print(json.dumps({**public, "reasons": reasons}))
        else:
            st = plan["settings"]
            print(f"profile {prof.name}: {'; '.join(reasons)}")
            print(f"precision {plan['precision']}; workspace {st['workspace_mb']} MB; builder opt level {st['opt_level']}; "
                  f"hardware compatibility {st['hardware_compatibility']}")
            for p in plan["engines"]:
                print(f"[{p['graph']}]")
                for name in ("input_ids", "attention_mask", "past_key_values.0.key"):
                    s_ = p["shapes"][name]
                    print(f"  {name:<24} min {s_['min']}  opt {s_['opt']}  max {s_['max']}")
                print("  " + " ".join(p["trtexec"]))
        return 0
    log = (lambda msg: None) if a.json else (lambda msg: print(msg, file=sys.stderr))
    res = build_engines(a.artifact, m, plan, force=a.force, log=log)
    if a.json:
        print(json.dumps({"profile": prof.name, "engines": plan["out_dir"], "built": res["built"], "reasons": res["reasons"],
                          "key": {g: e["key"] for g, e in res["record"]["graphs"].items()}}))
    else:
        print(f"engines {'written to' if res['built'] else 'up to date in'} {plan['out_dir']}"
              + (f" ({'; '.join(res['reasons'])})" if res["reasons"] else ""))
    return 0
