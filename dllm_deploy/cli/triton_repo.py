"""``dllm-deploy triton-repo``: a Triton model repository for a stock tritonserver."""
from __future__ import annotations

from ..errors import UserError
from .common import add_decode_flags, runtime
from .serve import add_limit_flags, check_serve_flags, serve_limits


def add_parser(sub) -> None:
    tr = sub.add_parser("triton-repo", help="write a Triton model repository for a stock tritonserver (docs/serving.md)")
    add_decode_flags(tr, json_flag=False)
    tr.add_argument("--out", required=True, help="the repository folder to write (refused if it holds anything else)")
    tr.add_argument("--force", action="store_true", help="replace a repository this command wrote before")
    add_limit_flags(tr)
    tr.set_defaults(func=run)


def run(a) -> int:
    from ..serving.repo import write_repo
    check_serve_flags(a)
    if not a.artifact:
        raise UserError("--artifact: the artifact the repository's models serve")
    rt = runtime(a)
    defaults, limits = serve_limits(a, rt)
    out = write_repo(a.out, a.artifact, rt.profile, defaults, limits, a.max_batch_size, force=a.force)
    print(f"Triton model repository written to {out} (models dllm, dllm_stream; profile {rt.profile.name}): "
          f"tritonserver --model-repository {out}")
    return 0
