"""``dllm-deploy distill``: certainty-forcing self-distillation into a new checkpoint."""
from __future__ import annotations

import json
import sys

from ..errors import UserError
from .common import progress


def add_parser(sub) -> None:
    ds = sub.add_parser("distill", help="certainty-forcing self-distillation into a new checkpoint (docs/distill.md)")
    ds.add_argument("--model", default="tiny", help="'tiny' or a Hugging Face folder: the student's start")
    ds.add_argument("--out", required=True, help="checkpoint folder to write")
    ds.add_argument("--teacher", default=None, help="teacher checkpoint (default: the model itself)")
    ds.add_argument("--prompts", default=None,
                    help="JSON lines of {\"prompt\", optional \"answer\"} (default: the bundled task families' training distribution)")
    ds.add_argument("--steps", type=int, default=6000)
    ds.add_argument("--batch", type=int, default=8)
    ds.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (60 warm-up steps, cosine to a tenth)")
    ds.add_argument("--seed", type=int, default=0)
    ds.add_argument("--entropy-weight", type=float, default=0.5, help="weight of the certainty (entropy) term")
    ds.add_argument("--entropy-temperature", type=float, default=1.0, help="the certainty term's softmax temperature")
    ds.add_argument("--teacher-prompts", type=int, default=256, help="prompts the teacher decodes")
    ds.add_argument("--reference-share", type=float, default=0.5,
                    help="share of each batch drawn fresh with reference answers (when the prompts have them)")
    ds.add_argument("--gen-length", type=int, default=128, help="the teacher's canvas (tokens)")
    ds.add_argument("--mix", default="", help="task family weights, e.g. count=2,text=0.3 (bundled tasks only)")
    ds.add_argument("--dist", default="train", choices=("train", "core"),
                    help="bundled tasks' distribution: train (original + broad inputs) or core (the original only)")
    ds.add_argument("--policy-share", type=float, default=0.0,
                    help="share of teacher-answer blocks noised as the threshold rule's own states "
                         "(block-causal models; 0: none)")
    ds.add_argument("--policy-tau", type=float, default=0.9, help="the threshold rule whose states those are")
    ds.add_argument("--policy-every", type=int, default=250, help="steps between recomputing them with the current student")
    ds.add_argument("--policy-pool", type=int, default=0,
                    help="record the states of this many fresh reference answers, redrawn every --policy-every steps, "
                         "and draw the batch's reference rows from them (0: the teacher's answers)")
    ds.add_argument("--threads", type=int, default=2)
    ds.add_argument("--time-limit", type=float, default=0, help="stop and write after this many seconds of training; the learning rate anneals by then (0: none)")
    ds.add_argument("--force", action="store_true", help="replace a checkpoint this command wrote")
    ds.add_argument("--json", action="store_true", help="print the training record as JSON")
    ds.set_defaults(func=run)


def run(a) -> int:
    from ..training.distill import DistillConfig, distill
    mix = dict(DistillConfig().mix)
    for item in filter(None, (a.mix or "").split(",")):
        fam, _, w = item.partition("=")
        try:
            mix[fam] = float(w)
        except ValueError:
            raise UserError(f"--mix: expected FAMILY=WEIGHT, got {item!r}") from None
    c = DistillConfig(steps=a.steps, batch=a.batch, lr=a.lr, seed=a.seed, entropy_weight=a.entropy_weight,
                      entropy_temperature=a.entropy_temperature, teacher_prompts=a.teacher_prompts,
                      reference_share=a.reference_share, gen_length=a.gen_length, threads=a.threads,
                      time_limit=a.time_limit, mix=mix, dist=a.dist, policy_share=a.policy_share,
                      policy_tau=a.policy_tau, policy_every=a.policy_every, policy_pool=a.policy_pool)
    tty = sys.stderr.isatty() and not a.json
    log = (lambda msg: None) if a.json else (lambda msg: print(msg, file=sys.stderr))
    rec = distill(a.model, a.out, teacher=a.teacher, prompts=a.prompts, dcfg=c, force=a.force, log=log,
                  progress=(lambda label, total: progress(total, label, True)) if tty else None)
    d = rec["distill"]
    if a.json:
        print(json.dumps(rec))
    else:
        print(f"distilled {a.model} into {a.out}: {d['steps_done']} steps in {d['wall_s']:.0f} s "
              f"(CPU {d['cpu_s']:.0f} s), cross-entropy {d['final_ce_ema']:.3f}, certainty entropy {d['final_entropy_ema']:.3f}; "
              f"teacher answers kept {d.get('teacher_kept', 0)}/{d['teacher_decoded']}")
    return 0
