"""Why the tiny model starts autoregressive: copying random strings, masked objective vs warm-up.

    python lab/copy_experiment.py --out /tmp/copy-masked
    python lab/copy_experiment.py --out /tmp/copy-warmup --ar-steps 700

Trains a 2-layer, 128-wide model of the tiny family on one task -- repeat a random string of
10-60 characters from [a-z0-9] in upper case (the prompt `upper: <string>`) -- with the training
script's own objective and prints its log (``loss_ema`` per 25 steps). Nothing but copying can
lower the loss below the entropy of the characters (ln 36 = 3.58 nats, less the EOS padding).
Extra arguments go to ``dllm_deploy.training.train`` (e.g. ``--steps``, ``--lr``, ``--threads``).
"""
from __future__ import annotations

import random
import string
import sys

from dllm_deploy.evals import tasks
from dllm_deploy.training import train


def random_copy(rng: random.Random) -> tasks.Example:
    s = "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(rng.randint(10, 60)))
    return tasks.Example("upper", f"upper: {s}\n", s.upper())


def main(argv: list[str]) -> None:
    tasks.GENERATORS["upper"] = random_copy
    only_upper = ",".join(f"{f}={int(f == 'upper')}" for f in train.MIX)
    train.main(["--hidden", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "384",
                "--lr", "1e-3", "--warmup", "100", "--steps", "1500", "--threads", "1",
                "--mix", only_upper, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
