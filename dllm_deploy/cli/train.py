"""``dllm-deploy train``: the bundled tiny dLLM's training recipe (torch; docs/training.md)."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from ..training.flags import add_train_arguments
    t = sub.add_parser("train", help="train a tiny block-diffusion dLLM with the bundled recipe (docs/training.md)",
                       description="Train the bundled tiny dLLM's recipe: block-causal masked diffusion over the "
                                   "bundled task families, byte vocabulary (torch; docs/training.md; `make train` "
                                   "runs the committed recipe).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_train_arguments(t)
    t.set_defaults(func=run)


def run(a) -> int:
    from ..training.train import run as train
    train(a)
    return 0
