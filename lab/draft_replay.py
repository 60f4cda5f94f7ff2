"""Why lossless SPD over the vanilla base accepts what it accepts (docs/algorithms.md).

    python lab/draft_replay.py --artifact build/art [--n 5] [--json]

Replays LLaDA vanilla (one token per step, most confident first) on the first block of N held-out
prompts per family, one forward per step, and asks of every step what a draft from the stale
predictions f(S) would have got right:

- when the chain draft's next step is wrong, is it the position (order) or the token;
- how often the true next position is the stale ranking's 2nd, or 2nd/3rd;
- the extra steps a tree preset would have accepted per verification (the SPD select walk,
  replayed on the recorded trajectory with the tree's own drafts), for chain and fork at W 4, 8;
- the rank of the true next position in the stale ranking (0 = the chain's guess), how often it
  trails the stale top by under 0.01 (a near tie), and the ceiling any tree of W nodes could reach
  if each step's rank were drawn independently from that distribution (the best W-1 draft paths;
  ranks >= 4 count as one child, which can only raise the ceiling).
"""
from __future__ import annotations

import argparse
import heapq
import json
import sys

import numpy as np


def trajectories(artifact: str, n: int):
    """Per prompt: the list of (state, top-1 ids, top-1 probs) of every vanilla step of block 0."""
    from dllm_deploy import Runtime
    from dllm_deploy.evals import tasks
    from dllm_deploy.runtime.rules import Vanilla
    from dllm_deploy.models.masks import tree_mask, tree_positions
    rt = Runtime.load(artifact=artifact, threads=1)
    be, cfg, tok = rt.backend, rt.config, rt.tokenizer
    m, L, rule = cfg.mask_token_id, cfg.block_size, Vanilla(1)
    out = []
    for ex in tasks.eval_split(families=tasks.FAMILIES, n=n):
        ids = np.array(tok.encode(ex.prompt), dtype=np.int64)[None]
        p = ids.shape[1]
        cache = be.new_cache(1, p + L)
        be.prefill(cache, ids, np.arange(p)[None], np.ones((1, 1, p, p), dtype=bool), p)
        mask, pos = tree_mask(p, L, 1), tree_positions(p, L, 1)
        state, traj = np.full(L, m, dtype=np.int64), []
        while (state == m).any():
            top_i, top_p = be.verify(cache, state[None], pos[None].astype(np.int64), mask[None, None])
            traj.append((state.copy(), top_i[0, :, 0].copy(), top_p[0, :, 0].copy()))
            state = rule(state, traj[-1][1], traj[-1][2], 0, m)
        out.append(traj)
    return out, m


def replay(trajs, m, preset: str, width: int) -> float:
    """Mean extra steps accepted per verification by lossless select over the preset's drafts."""
    from dllm_deploy.runtime.rules import Vanilla
    from dllm_deploy.runtime.tree import Drafter, make_tree
    spec, drafter = make_tree(preset, width), Drafter(Vanilla(1), m)
    total = count = 0
    for traj in trajs:
        for t, (state, ids, probs) in enumerate(traj):
            nodes = drafter.draft(spec, state, ids[:, None], probs[:, None], 0)   # node 0 = traj[t + 1]
            cur, depth = 0, 0
            while t + depth + 2 < len(traj):           # the state vanilla reaches after node `cur`
                after = traj[t + depth + 2][0]
                nxt = next((c for c in spec.children(cur) if np.array_equal(nodes[c], after)), None)
                if nxt is None:
                    break
                cur, depth = nxt, depth + 1
            total, count = total + depth, count + 1
    return total / max(count, 1)


def tree_ceiling(rank_probs: list[float], width: int) -> float:
    """Expected extra steps per verification of the best tree of ``width`` nodes (node 0 is the
    exact step) when each step's true next position has stale rank r with probability
    rank_probs[r], independently: the sum of the width-1 most likely draft paths."""
    heap = [(-q, (r,)) for r, q in enumerate(rank_probs)]
    heapq.heapify(heap)
    total = 0.0
    for _ in range(width - 1):
        if not heap:
            break
        q, path = heapq.heappop(heap)
        total -= q
        for r, p in enumerate(rank_probs):
            heapq.heappush(heap, (q * p, path + (r,)))
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--n", type=int, default=5, help="held-out prompts per family")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from dllm_deploy.runtime.rules import _ranked_masked as ranked
    trajs, m = trajectories(a.artifact, a.n)
    miss = {"position": 0, "token": 0}
    hit2 = hit23 = steps = near_tie = 0
    ranks = [0] * 5                                         # rank 0, 1, 2, 3, >= 4
    for traj in trajs:
        for t in range(len(traj) - 2):
            state, ids, probs = traj[t]
            nxt_state = traj[t + 1][0]
            order = ranked(nxt_state, probs, m)             # the stale ranking after the true step
            true_pos = ranked(nxt_state, traj[t + 1][2], m)[0]
            true_tok = traj[t + 1][1][true_pos]
            steps += 1
            hit2 += order[0] == true_pos
            hit23 += true_pos in order[:2]
            r = int(np.flatnonzero(order == true_pos)[0]) if true_pos in order else 4
            ranks[min(r, 4)] += 1
            near_tie += r > 0 and probs[order[0]] - probs[true_pos] < 0.01
            if order[0] != true_pos:
                miss["position"] += 1
            elif ids[true_pos] != true_tok:
                miss["token"] += 1
    res = {"prompts": len(trajs), "steps": steps, "chain_misses": miss,
           "next_position_is_stale_2nd": round(hit2 / steps, 3),
           "next_position_in_stale_2nd_or_3rd": round(hit23 / steps, 3),
           "true_next_rank_in_stale": {("4+" if r == 4 else str(r)): round(c / steps, 3) for r, c in enumerate(ranks)},
           "near_tie_share": round(near_tie / steps, 3),
           "accepted_extra_steps": {f"{p} W{w}": round(replay(trajs, m, p, w), 3)
                                    for p in ("chain", "fork") for w in (4, 8)},
           "tree_ceiling_extra_steps": {f"W{w}": round(tree_ceiling([c / steps for c in ranks], w), 3)
                                        for w in (4, 8, 16, 32)}}
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
