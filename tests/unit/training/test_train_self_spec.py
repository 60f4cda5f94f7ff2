"""The tri-mode fine-tune's batches (training/self_spec.py): what each copy attends and where
each loss is taken, checked position by position (no model runs)."""
from __future__ import annotations

import random

import torch

from dllm_deploy.models.tokenizer import ByteTokenizer
from dllm_deploy.training.self_spec import make_batch


def test_batch_masks_and_targets():
    tok = ByteTokenizer()
    ids, pos, mask, tgt, ar, dif = make_batch(random.Random(0), 4, tok, set(), block=8, full_share=0.5)
    b, n = ids.shape
    s = n // 2
    assert mask.shape == (b, 1, n, n) and (pos[:, :s] == pos[:, s:]).all()
    for r in range(b):
        m = int((ids[r, :s] != tok.PAD).sum())                    # the sequence's length
        clean, noisy = ids[r, :m], ids[r, s:s + m]
        assert (tgt[r, :m - 1] == clean[1:]).all() and (tgt[r, s:s + m] == clean).all()
        # the clean copy is causal over real tokens
        assert torch.equal(mask[r, 0, :m, :m], torch.ones(m, m, dtype=torch.bool).tril())
        assert not mask[r, 0, :s, s:].any()                        # it never sees the noisy copy
        # the diffusion loss is taken exactly at the masked positions; the AR loss predicts the answer
        assert torch.equal(dif[r, s:s + m], noisy == tok.MASK) and not dif[r, :s].any()
        assert ar[r, :m - 1].any() and not ar[r, m - 1:].any()
        for i in range(m):                                         # a noisy token's block
            row = mask[r, 0, s + i]
            own = row[s:s + m].nonzero().flatten().tolist()
            start, end = own[0], own[-1] + 1
            assert start <= i < end and end - start <= 8 and own == list(range(start, end))
            assert row[:start].all() and not row[start:s].any()   # the clean prefix before the block only
            assert noisy[start] != tok.MASK                        # the block keeps its seed
