import numpy as np

from dllm_deploy.models.masks import block_causal_mask, tree_mask, tree_positions

T, F = True, False


def test_block_causal_mask_hand_drawn():
    # prompt (block 0) of 2 tokens, then two blocks of 2
    got = block_causal_mask(np.array([0, 0, 1, 1, 2, 2]))
    want = np.array([
        [T, T, F, F, F, F],
        [T, T, F, F, F, F],
        [T, T, T, T, F, F],
        [T, T, T, T, F, F],
        [T, T, T, T, T, T],
        [T, T, T, T, T, T],
    ])
    assert (got == want).all()


def test_block_causal_mask_with_cached_prefix():
    got = block_causal_mask(np.array([2, 2]), past_block_ids=np.array([0, 1, 1]))
    assert (got == np.array([[T, T, T, T, T], [T, T, T, T, T]])).all()
    got = block_causal_mask(np.array([1]), past_block_ids=np.array([0, 2]))
    assert (got == np.array([[T, F, T]])).all()


def test_tree_mask_hand_drawn():
    # prefix of 2, three branches of 2 tokens
    got = tree_mask(2, 2, 3)
    want = np.array([
        [T, T, T, T, F, F, F, F],
        [T, T, T, T, F, F, F, F],
        [T, T, F, F, T, T, F, F],
        [T, T, F, F, T, T, F, F],
        [T, T, F, F, F, F, T, T],
        [T, T, F, F, F, F, T, T],
    ])
    assert (got == want).all()


def test_tree_mask_respects_invalid_prefix_slots():
    got = tree_mask(3, 1, 2, prefix_valid=np.array([F, T, T]))
    assert (got == np.array([[F, T, T, T, F], [F, T, T, F, T]])).all()


def test_tree_positions_repeat_per_branch():
    assert tree_positions(5, 3, 2).tolist() == [5, 6, 7, 5, 6, 7]
