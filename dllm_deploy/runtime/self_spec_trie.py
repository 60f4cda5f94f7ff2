"""tree-spec's verification tree (runtime/self_spec.py): the W most probable draft sequences
merged into a trie, and the path of it a causal verification accepts. Pure numpy."""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass
class Trie:
    """A verification tree: node 0 is the seed; ``parent[i]`` < i; ``depth[i]`` its offset after the seed."""
    tokens: np.ndarray
    parent: np.ndarray
    depth: np.ndarray

    def ancestors(self) -> np.ndarray:
        """(N,N) bool: [i, j] when j is i or an ancestor of i."""
        n = len(self.tokens)
        anc = np.eye(n, dtype=bool)
        for i in range(1, n):
            anc[i] |= anc[self.parent[i]]
        return anc


def best_sequences(ids: np.ndarray, probs: np.ndarray, width: int) -> list[tuple[int, ...]]:
    """The ``width`` most probable sequences under independent per-position choices among the
    (n,K) candidates ``ids`` with probabilities ``probs``, best first (beam search keeps the exact
    W best of a product distribution: a prefix of one of them is among the W best prefixes)."""
    beam = [(0.0, ())]
    logp = np.log(np.maximum(probs.astype(np.float64), 1e-30))
    for d in range(ids.shape[0]):
        cand = [(s - logp[d, j], seq + (int(ids[d, j]),)) for s, seq in beam for j in range(ids.shape[1])]
        beam = heapq.nsmallest(width, cand)
    return [seq for _, seq in beam]


def build_trie(seed: int, ids: np.ndarray, probs: np.ndarray, width: int) -> Trie:
    """The trie of the ``width`` best draft sequences after ``seed`` (``ids``/``probs`` (L-1,K): the
    draft's candidates at the block's positions after the seed)."""
    tokens, parent, depth = [seed], [-1], [0]
    child: dict[tuple[int, int], int] = {}
    for seq in best_sequences(ids, probs, width):
        at = 0
        for d, tok in enumerate(seq):
            nxt = child.get((at, tok))
            if nxt is None:
                nxt = len(tokens)
                child[(at, tok)] = nxt
                tokens.append(tok)
                parent.append(at)
                depth.append(d + 1)
            at = nxt
    return Trie(np.array(tokens, np.int64), np.array(parent, np.int64), np.array(depth, np.int64))


def accepted_path(trie: Trie, predicted: np.ndarray) -> list[int]:
    """Node ids of the longest root path whose every node's token equals its parent's causal
    prediction (``predicted[i]``: the token the model predicts after node i)."""
    path = [0]
    while True:
        at = path[-1]
        nxt = [i for i in range(at + 1, len(trie.tokens))
               if trie.parent[i] == at and trie.tokens[i] == predicted[at]]
        if not nxt:
            return path
        path.append(nxt[0])
