"""Continuous batching (Runtime.stream(join=...)): rows that join a running batch at a block
boundary decode exactly as they do alone — the same tokens and forward counts, greedy and
seeded — whether the joiner's prompt is longer or shorter than the running rows' prefix, whether
the running rows are still live or have all finished, and on every strategy and block-causal cache
mode that keeps a cache (exact, delayed)."""
import pytest

from dllm_deploy.runtime.rows import RowOptions

from tests.conftest import STRATEGIES

GEN = 64
LONG = "reverse: river stone cloud garden window light\n"      # its answer outlives the first block
SHORT = "upper: cat\n"
WORDS = ["lantern", "harbor", "meadow", "copper", "violet", "thunder", "marble"]
LONGER = "reverse: " + " ".join(WORDS * 2) + "\n"       # wider than LONG's prefix after a block: LONG's side pads


@pytest.fixture(scope="module")
def ort(tiny_artifact):
    from dllm_deploy import Runtime
    return Runtime.load(artifact=str(tiny_artifact[0]))


def joiner(*waves):
    """A join callable handing over one wave of [(prompt, RowOptions)] per block boundary."""
    waves = list(waves)
    return lambda: waves.pop(0) if waves else []


def run(rt, prompts, rows, join, **kw):
    """index -> (text, ids, forwards, finish_reason) of a stream."""
    out = {}
    for c in rt.stream(prompts, rows=rows, join=join, **kw):
        text, ids, _, _ = out.get(c["index"], ("", [], 0, None))
        out[c["index"]] = (text + c["delta"], ids + c["token_ids"], c["forwards"], c["finish_reason"])
    return out


def alone(rt, prompt, row, **kw):
    r = rt.generate([prompt], rows=[row], **kw)[0]
    return r.text, r.token_ids, r.forwards, r.finish_reason


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_joined_rows_decode_as_they_do_alone(ort, name):
    kw = {**STRATEGIES[name], "gen_length": GEN}
    assert ort.joins_batches(**kw)
    g = RowOptions()
    got = run(ort, [LONG], [g], joiner([(LONGER, g), (SHORT, g)]), **kw)
    assert sorted(got) == [0, 1, 2]
    for i, p in enumerate([LONG, LONGER, SHORT]):
        assert got[i] == alone(ort, p, g, **kw), (name, i, p)


def test_rows_join_under_the_delayed_cache(ort):
    """The delayed cache holds in-block keys only until the block's commit: rows join at block
    boundaries as they do under the exact cache, greedy and seeded."""
    kw = {"strategy": "threshold", "threshold": 0.98, "threshold_far": 0.999, "threshold_lead": 0.7,
          "cache": "delayed", "gen_length": GEN}
    assert ort.joins_batches(**kw)
    rows = [RowOptions(), RowOptions(temperature=0.7, top_p=0.9, seed=2), RowOptions()]
    got = run(ort, [LONG], rows[:1], joiner([(LONGER, rows[1])], [(SHORT, rows[2])]), **kw)
    assert sorted(got) == [0, 1, 2]
    for i, (p, o) in enumerate(zip([LONG, LONGER, SHORT], rows)):
        assert got[i] == alone(ort, p, o, **kw), (i, p)


def test_seeded_rows_join_with_their_own_noise(ort):
    """Joins at the first and third boundary (none at the second) while LONGER's 104-character
    answer keeps the batch running for four blocks."""
    kw = {"strategy": "spd", "beam_width": 4, "gen_length": 2 * GEN}
    rows = [RowOptions(temperature=0.7, top_p=0.9, seed=s) for s in (1, 2, 3)]
    got = run(ort, [LONGER], rows[:1], joiner([(SHORT, rows[1])], [], [(LONG, rows[2])]), **kw)
    assert sorted(got) == [0, 1, 2]
    for i, (p, o) in enumerate(zip([LONGER, SHORT, LONG], rows)):
        assert got.get(i) == alone(ort, p, o, **kw), (i, p)


def test_a_row_joins_a_batch_whose_rows_all_finished(ort):
    kw = {"strategy": "threshold", "gen_length": GEN}
    g = RowOptions()
    got = run(ort, [SHORT], [g], joiner([(LONG, g)]), **kw)       # SHORT ends in its first block
    assert got[1] == alone(ort, LONG, g, **kw)


def test_batches_wait_where_rows_cannot_join(ort):
    kw = {"gen_length": GEN, "cache": "none"}
    assert not ort.joins_batches(**kw)
    asked = []
    got = run(ort, [LONG], None, lambda: asked.append(1) or [], **kw)
    assert not asked and list(got) == [0]
