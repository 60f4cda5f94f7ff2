"""``dllm-deploy train-selfspec``: fine-tune a block-diffusion checkpoint into the tri-mode
(self-speculative) layout (torch; docs/training.md, "The self-speculative model")."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from ..training.flags import add_self_spec_arguments
    t = sub.add_parser("train-selfspec", help="fine-tune the tiny dLLM into a self-speculative (tri-mode) model",
                       description="Fine-tune a block-diffusion checkpoint (default: the bundled tiny model) with the "
                                   "joint autoregressive + block-diffusion loss into the Nemotron-Labs-Diffusion layout "
                                   "(torch; docs/training.md; `make train-selfspec` runs the committed recipe).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_self_spec_arguments(t)
    t.set_defaults(func=run)


def run(a) -> int:
    from ..training.self_spec import run as fine_tune
    fine_tune(a)
    return 0
