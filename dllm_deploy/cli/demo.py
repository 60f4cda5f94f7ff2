"""``dllm-deploy demo``: the main job on the bundled tiny model, printing the figures."""
from __future__ import annotations




def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="the main job on the bundled tiny model, printing the figures")
    d.add_argument("--out", default="build/demo", help="where the demo writes its artifact")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=run)


def run(a) -> int:
    from ..demo import run_demo
    return run_demo(json_out=a.json, out_dir=a.out)
