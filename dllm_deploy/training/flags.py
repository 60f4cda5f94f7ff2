"""The flags of ``dllm-deploy train`` (training/train.py) and ``dllm-deploy train-selfspec``
(training/self_spec.py): torch-free, so that the command line declares them without loading torch."""
from __future__ import annotations

from pathlib import Path

from ..models.loading import TINY_DIR

COPIES = 1  # independent noisy copies of the answer per row
SUFFIX_SHARE = 0.5  # share of blocks noised by suffix masking (the rest: each token masked w.p. t ~ U(0,1))


def add_train_arguments(ap) -> None:
    """The training recipe's flags on the argparse parser ``ap``."""
    ap.add_argument("--out", type=Path, required=True, help="folder for config.json + model.safetensors")
    ap.add_argument("--steps", type=int, default=3600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=640)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log", type=Path, default=None, help="JSON-lines training log (default OUT/train_log.jsonl)")
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--stop-after", type=int, default=0, help="stop after this many steps (schedule of --steps)")
    ap.add_argument("--suffix-share", type=float, default=SUFFIX_SHARE, help="share of blocks with suffix masking")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="continue from the weights in this folder (a second phase with its own schedule)")
    ap.add_argument("--time-steps", type=int, default=0, help="only time this many steps and exit")
    ap.add_argument("--mix", default="", help="family weights overriding the default mix, e.g. text=0.4,letter=1.0")
    ap.add_argument("--ar-mix", default="",
                    help="the warm-up's own family weights over --mix's (e.g. upper=4,text=0: copying random "
                         "strings is what forms the copy circuit); default: the same mix")
    ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda): the script runs on a CPU; a GPU is faster")
    ap.add_argument("--pool", type=int, default=8, help="batches drawn at once and bucketed by length (1: no bucketing)")
    ap.add_argument("--copies", type=int, default=COPIES, help="independent noisy copies of the answer per row")
    ap.add_argument("--ar-steps", type=int, default=0,
                    help="first steps train next-token prediction (causal mask) before block diffusion")
    ap.add_argument("--ar-until-loss", type=float, default=0,
                    help="end the warm-up early once its loss average falls to this (the copy circuit has formed; "
                         "--ar-steps is then the longest warm-up). 0: always --ar-steps")
    ap.add_argument("--ar-margin", type=int, default=0,
                    help="with --ar-until-loss: warm-up steps still taken after the bound is reached (within --ar-steps)")
    ap.add_argument("--max-answer", type=int, default=0, help="curriculum: only answers of at most this many bytes")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="save and stop once this many seconds have passed (0: no limit); training.json records it")
    ap.add_argument("--anneal-by-time", action="store_true",
                    help="with --time-limit: the cosine schedule ends at the time limit when that comes before --steps")
    ap.add_argument("--autocast", choices=("none", "bf16"), default="none",
                    help="bf16: forward under torch.autocast (bfloat16 products, fp32 weights, optimizer and loss); "
                         "about 1.3x faster steps on a CPU with AMX or AVX512-BF16, slower than fp32 on one without "
                         "(a warning says so; docs/training.md)")
    ap.add_argument("--dist", choices=("core", "train"), default="core",
                    help="task inputs: core (the 149-word vocabulary the bundled model learned) or train "
                         "(half core, half broad: random words, any sentence length; never the generalization split's)")


SELF_SPEC_BLOCK = 16   # the tri-mode model's draft block (training/self_spec.py)


def add_self_spec_arguments(ap) -> None:
    """The flags of ``dllm-deploy train-selfspec`` (training/self_spec.py) on the parser ``ap``."""
    ap.add_argument("--out", type=Path, required=True, help="folder for config.json + model.safetensors")
    ap.add_argument("--init-from", type=Path, default=TINY_DIR,
                    help="the block-diffusion checkpoint to start from (default: the bundled tiny model)")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--alpha", type=float, default=1.0, help="weight of the diffusion loss")
    ap.add_argument("--block", type=int, default=SELF_SPEC_BLOCK, help="draft block length")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
