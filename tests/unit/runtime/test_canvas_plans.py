"""runtime/canvas.py, drawn by hand: every plan of two blocks of L = 2 at W = 2, for each cache
mode, over a two-row batch whose second row is left-padded.

    row 0: prompt [5 6 7]    positions 0 1 2
    row 1: prompt [_ 8 9]    positions 0 0 1   (_ = pad: no other token attends it)

Masks are drawn one string per query token: '1' may attend the key, '.' may not.
"""
import numpy as np
import pytest

from dllm_deploy.runtime import canvas

M = 99  # mask id
PREFIX = canvas.Prefix.of_prompts([[5, 6, 7], [8, 9]], pad_id=0)
BLOCK0 = np.array([[10, 11], [12, 13]])                               # block 0 once decoded
PREFIX1 = PREFIX.extend(BLOCK0)
MASKS = np.full((2, 2), M)
NODES0 = np.array([[[10, M], [10, 11]], [[12, M], [M, 13]]])           # (B,W,L) drafted in block 0
NODES1 = np.array([[[20, M], [20, 21]], [[22, M], [M, 23]]])           # ... in block 1


def drawn(row0: list[str], row1: list[str]) -> np.ndarray:
    """(2,1,T,S) bool from the two rows' drawings."""
    return np.array([[[[c == "1" for c in q] for q in rows]] for rows in (row0, row1)])


def check(plan, ids, positions, mask, keep, cache, read):
    assert plan.ids.tolist() == ids
    assert plan.positions.tolist() == positions
    assert plan.mask.shape == mask.shape and (plan.mask == mask).all(), (plan.mask.astype(int), mask.astype(int))
    assert (plan.keep, plan.cache, plan.read.tolist()) == (keep, cache, read)


def test_prefix_of_prompts_and_extend():
    assert PREFIX.ids.tolist() == [[5, 6, 7], [0, 8, 9]]
    assert PREFIX.positions.tolist() == [[0, 1, 2], [0, 0, 1]]
    assert PREFIX.valid.tolist() == [[True] * 3, [False, True, True]]
    assert PREFIX1.ids.tolist() == [[5, 6, 7, 10, 11], [0, 8, 9, 12, 13]]
    assert PREFIX1.positions.tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 2, 3]]
    assert PREFIX1.blocks.tolist() == [[0, 0, 0, 1, 1]] * 2
    assert PREFIX1.take(np.array([1])).ids.tolist() == [[0, 8, 9, 12, 13]]


# -- block-causal model ------------------------------------------------------------------------

def test_block_causal_exact():
    check(canvas.first_block(PREFIX, MASKS, "exact"),
          [[5, 6, 7, M, M], [0, 8, 9, M, M]], [[0, 1, 2, 3, 4], [0, 0, 1, 2, 3]],
          drawn(["111..", "111..", "111..", "11111", "11111"],
                ["111..", ".11..", ".11..", ".1111", ".1111"]), 3, "reuse", [[3, 4]])
    check(canvas.tree_verify(PREFIX, NODES0, "exact"),
          [[10, M, 10, 11], [12, M, M, 13]], [[3, 4, 3, 4], [2, 3, 2, 3]],
          drawn(["11111..", "11111..", "111..11", "111..11"],
                [".1111..", ".1111..", ".11..11", ".11..11"]), 0, "reuse", [[0, 1], [2, 3]])
    check(canvas.commit_next(PREFIX, BLOCK0, MASKS, "exact"),
          [[10, 11, M, M], [12, 13, M, M]], [[3, 4, 5, 6], [2, 3, 4, 5]],
          drawn(["11111..", "11111..", "1111111", "1111111"],
                [".1111..", ".1111..", ".111111", ".111111"]), 2, "reuse", [[2, 3]])
    check(canvas.tree_verify(PREFIX1, NODES1, "exact"),
          [[20, M, 20, 21], [22, M, M, 23]], [[5, 6, 5, 6], [4, 5, 4, 5]],
          drawn(["1111111..", "1111111..", "11111..11", "11111..11"],
                [".111111..", ".111111..", ".1111..11", ".1111..11"]), 0, "reuse", [[0, 1], [2, 3]])


def test_block_causal_none():
    """Nothing cached: the prefix rides in every call, block-causal among itself."""
    check(canvas.first_block(PREFIX, MASKS, "none"),
          [[5, 6, 7, M, M], [0, 8, 9, M, M]], [[0, 1, 2, 3, 4], [0, 0, 1, 2, 3]],
          drawn(["111..", "111..", "111..", "11111", "11111"],
                ["111..", ".11..", ".11..", ".1111", ".1111"]), 0, "scratch", [[3, 4]])
    check(canvas.tree_verify(PREFIX, NODES0, "none"),
          [[5, 6, 7, 10, M, 10, 11], [0, 8, 9, 12, M, M, 13]], [[0, 1, 2, 3, 4, 3, 4], [0, 0, 1, 2, 3, 2, 3]],
          drawn(["111....", "111....", "111....", "11111..", "11111..", "111..11", "111..11"],
                ["111....", ".11....", ".11....", ".1111..", ".1111..", ".11..11", ".11..11"]),
          0, "scratch", [[3, 4], [5, 6]])
    check(canvas.commit_next(PREFIX, BLOCK0, MASKS, "none"),
          [[5, 6, 7, 10, 11, M, M], [0, 8, 9, 12, 13, M, M]], [[0, 1, 2, 3, 4, 5, 6], [0, 0, 1, 2, 3, 4, 5]],
          drawn(["111....", "111....", "111....", "11111..", "11111..", "1111111", "1111111"],
                ["111....", ".11....", ".11....", ".1111..", ".1111..", ".111111", ".111111"]),
          0, "scratch", [[5, 6]])
    check(canvas.tree_verify(PREFIX1, NODES1, "none"),
          [[5, 6, 7, 10, 11, 20, M, 20, 21], [0, 8, 9, 12, 13, 22, M, M, 23]],
          [[0, 1, 2, 3, 4, 5, 6, 5, 6], [0, 0, 1, 2, 3, 4, 5, 4, 5]],
          drawn(["111......", "111......", "111......", "11111....", "11111....",
                 "1111111..", "1111111..", "11111..11", "11111..11"],
                ["111......", ".11......", ".11......", ".1111....", ".1111....",
                 ".111111..", ".111111..", ".1111..11", ".1111..11"]), 0, "scratch", [[5, 6], [7, 8]])


# -- bidirectional model: block 0 has a suffix of 2 masks, block 1 none -----------------------

CANVAS0_ROWS = (["1111111"] * 7, ["1111111"] + [".111111"] * 6)   # every valid token, pads themselves


@pytest.mark.parametrize("mode,anchor,keep,cache", [("none", False, 0, "scratch"), ("prefix", False, 3, "new"),
                                                    ("none", True, 0, "scratch"), ("prefix", True, 2, "new")])
def test_refresh_in_order(mode, anchor, keep, cache):
    """[prefix | block | suffix]; Dream's anchor (the prompt's last token) stays out of the cache."""
    check(canvas.refresh(PREFIX, MASKS, 2, M, mode, anchor),
          [[5, 6, 7, M, M, M, M], [0, 8, 9, M, M, M, M]], [[0, 1, 2, 3, 4, 5, 6], [0, 0, 1, 2, 3, 4, 5]],
          drawn(*CANVAS0_ROWS), keep, cache, [[3, 4]])
    check(canvas.refresh(PREFIX1, MASKS, 0, M, mode, anchor),
          [[5, 6, 7, 10, 11, M, M], [0, 8, 9, 12, 13, M, M]], [[0, 1, 2, 3, 4, 5, 6], [0, 0, 1, 2, 3, 4, 5]],
          drawn(*CANVAS0_ROWS), keep and keep + 2, cache, [[5, 6]])


def test_refresh_dual():
    """[prefix | suffix | block]: one keep covers prefix and suffix; with the anchor,
    [prefix less its last token | suffix | anchor | block]."""
    check(canvas.refresh(PREFIX, MASKS, 2, M, "dual", False),
          [[5, 6, 7, M, M, M, M], [0, 8, 9, M, M, M, M]], [[0, 1, 2, 5, 6, 3, 4], [0, 0, 1, 4, 5, 2, 3]],
          drawn(*CANVAS0_ROWS), 5, "new", [[5, 6]])
    check(canvas.refresh(PREFIX, MASKS, 2, M, "dual", True),
          [[5, 6, M, M, 7, M, M], [0, 8, M, M, 9, M, M]], [[0, 1, 5, 6, 2, 3, 4], [0, 0, 4, 5, 1, 2, 3]],
          drawn(*CANVAS0_ROWS), 4, "new", [[5, 6]])
    check(canvas.refresh(PREFIX1, MASKS, 0, M, "dual", True),
          [[5, 6, 7, 10, 11, M, M], [0, 8, 9, 12, 13, M, M]], [[0, 1, 2, 3, 4, 5, 6], [0, 0, 1, 2, 3, 4, 5]],
          drawn(*CANVAS0_ROWS), 4, "new", [[5, 6]])


def test_canvas_verify_none_is_the_canvas_of_node_0():
    check(canvas.canvas_verify(PREFIX, NODES0, 2, M, "none", True),
          [[5, 6, 7, 10, M, M, M], [0, 8, 9, 12, M, M, M]], [[0, 1, 2, 3, 4, 5, 6], [0, 0, 1, 2, 3, 4, 5]],
          drawn(*CANVAS0_ROWS), 0, "scratch", [[3, 4]])


def test_canvas_verify_prefix():
    """Each branch [node | suffix] over the cached prefix."""
    check(canvas.canvas_verify(PREFIX, NODES0, 2, M, "prefix", False),
          [[10, M, M, M, 10, 11, M, M], [12, M, M, M, M, 13, M, M]],
          [[3, 4, 5, 6, 3, 4, 5, 6], [2, 3, 4, 5, 2, 3, 4, 5]],
          drawn(["1111111...."] * 4 + ["111....1111"] * 4, [".111111...."] * 4 + [".11....1111"] * 4),
          0, "reuse", [[0, 1], [4, 5]])
    check(canvas.canvas_verify(PREFIX1, NODES1, 0, M, "prefix", False),
          [[20, M, 20, 21], [22, M, M, 23]], [[5, 6, 5, 6], [4, 5, 4, 5]],
          drawn(["1111111.."] * 2 + ["11111..11"] * 2, [".111111.."] * 2 + [".1111..11"] * 2),
          0, "reuse", [[0, 1], [2, 3]])


def test_canvas_verify_dual():
    """The suffix is cached after the prefix: each branch is its node only."""
    check(canvas.canvas_verify(PREFIX, NODES0, 2, M, "dual", False),
          [[10, M, 10, 11], [12, M, M, 13]], [[3, 4, 3, 4], [2, 3, 2, 3]],
          drawn(["1111111.."] * 2 + ["11111..11"] * 2, [".111111.."] * 2 + [".1111..11"] * 2),
          0, "reuse", [[0, 1], [2, 3]])


def test_canvas_verify_anchor():
    """Dream: each branch [anchor | node (| suffix under prefix)], the anchor out of the cache."""
    check(canvas.canvas_verify(PREFIX, NODES0, 2, M, "prefix", True),
          [[7, 10, M, M, M, 7, 10, 11, M, M], [9, 12, M, M, M, 9, M, 13, M, M]],
          [[2, 3, 4, 5, 6, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]],
          drawn(["1111111....."] * 5 + ["11.....11111"] * 5, [".111111....."] * 5 + [".1.....11111"] * 5),
          0, "reuse", [[1, 2], [6, 7]])
    check(canvas.canvas_verify(PREFIX, NODES0, 2, M, "dual", True),
          [[7, 10, M, 7, 10, 11], [9, 12, M, 9, M, 13]], [[2, 3, 4, 2, 3, 4], [1, 2, 3, 1, 2, 3]],
          drawn(["1111111..."] * 3 + ["1111...111"] * 3, [".111111..."] * 3 + [".111...111"] * 3),
          0, "reuse", [[1, 2], [4, 5]])
    for mode in ("prefix", "dual"):                       # block 1: no suffix, the same in both modes
        check(canvas.canvas_verify(PREFIX1, NODES1, 0, M, mode, True),
              [[11, 20, M, 11, 20, 21], [13, 22, M, 13, M, 23]], [[4, 5, 6, 4, 5, 6], [3, 4, 5, 3, 4, 5]],
              drawn(["1111111..."] * 3 + ["1111...111"] * 3, [".111111..."] * 3 + [".111...111"] * 3),
              0, "reuse", [[1, 2], [4, 5]])


def test_a_builder_refuses_the_other_attentions_modes():
    with pytest.raises(ValueError):
        canvas.tree_verify(PREFIX, NODES0, "prefix")
    with pytest.raises(ValueError):
        canvas.refresh(PREFIX, MASKS, 2, M, "exact", False)
