"""Runtime.stream and the stop conditions on the tiny ONNX artifact (docs/streaming.md): chunks
concatenate to generate's result on every strategy, max_tokens and stop strings cut where the
contract says, finished rows leave the batch, and closing the stream leaves the runtime usable."""
import pytest

from dllm_deploy.errors import OptionError, UserError
from dllm_deploy.evals import tasks
from dllm_deploy.runtime.rows import RowOptions

from tests.conftest import STRATEGIES

GEN = 64


@pytest.fixture(scope="module")
def ort(tiny_artifact):
    from dllm_deploy import Runtime
    return Runtime.load(artifact=str(tiny_artifact[0]))


@pytest.fixture(scope="module")
def prompts():
    return [e.prompt for e in tasks.eval_split(families=("upper", "reverse"), n=1)]


def collect(chunks):
    """index -> (text, ids, chunks) from a stream."""
    out = {}
    for c in chunks:
        text, ids, cs = out.setdefault(c["index"], ("", [], []))
        out[c["index"]] = (text + c["delta"], ids + c["token_ids"], cs + [c])
    return out


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_chunks_concatenate_to_the_result_on_every_strategy(ort, prompts, name):
    kw = {**STRATEGIES[name], "gen_length": GEN}
    results = ort.generate(prompts, **kw)
    streamed = collect(ort.stream(prompts, **kw))
    for i, r in enumerate(results):
        text, ids, cs = streamed[i]
        assert (text, ids) == (r.text, r.token_ids)
        assert [c["finish_reason"] for c in cs[:-1]] == [None] * (len(cs) - 1)
        assert cs[-1]["finish_reason"] == r.finish_reason and cs[-1]["tokens"] == r.tokens
        assert cs[-1]["forwards"] == r.forwards
        assert [c["tokens"] for c in cs] == sorted(c["tokens"] for c in cs)
        assert r.finished == (r.finish_reason == "eos") and r.finish_reason in ("eos", "length")
        assert r.finish_reason == "length" or r.token_ids[-1] == ort.config.eos_token_id
        assert 0 < r.time_to_first_token_s <= r.wall_s
        assert len(cs) > 1            # text arrives before the end


def test_max_tokens_is_the_first_tokens_and_sets_the_canvas(ort, prompts):
    full = ort.generate(prompts[0], gen_length=GEN)[0]
    n = 5
    [r] = ort.generate(prompts[0], gen_length=GEN, max_tokens=n)
    assert r.token_ids == full.token_ids[:n] and r.tokens == n and r.finish_reason == "length"
    assert r.forwards <= full.forwards
    [alone] = ort.generate(prompts[0], max_tokens=40)            # gen_length defaults to max_tokens
    assert len(alone.token_ids) <= 40
    with pytest.raises(OptionError, match=r"max tokens \(65\) exceeds gen length \(64\)"):
        ort.generate(prompts[0], gen_length=64, max_tokens=65)
    with pytest.raises(OptionError):
        ort.generate(prompts[0], max_tokens=0)


def test_stop_string_cuts_text_and_ids_and_the_row_leaves(ort, prompts):
    full = ort.generate(prompts, gen_length=GEN)
    text = full[0].text
    stop = text[3:5]
    cut = text.index(stop)
    res = ort.generate(prompts, gen_length=GEN, stop=[stop, "\x00never"])
    r = res[0]
    assert r.text == text[:cut] and r.finish_reason == "stop" and r.finished
    assert ort.tokenizer.decode(r.token_ids) == r.text and r.token_ids == full[0].token_ids[:len(r.token_ids)]
    assert r.forwards <= full[0].forwards
    # the other row runs on as before unless its own text has the stop string
    if stop not in full[1].text:
        assert res[1].token_ids == full[1].token_ids and res[1].forwards == full[1].forwards


def test_rows_bring_their_own_options(ort, prompts):
    full = ort.generate(prompts, gen_length=GEN)
    res = ort.generate(prompts, rows=[RowOptions(max_tokens=3), RowOptions()], gen_length=GEN)
    assert res[0].token_ids == full[0].token_ids[:3] and res[1].token_ids == full[1].token_ids
    with pytest.raises(UserError, match="one RowOptions per prompt"):
        ort.generate(prompts, rows=[RowOptions()])
    with pytest.raises(OptionError, match="exceeds gen length"):
        ort.generate(prompts, rows=[RowOptions(max_tokens=GEN + 1), RowOptions()], gen_length=GEN)


def test_closing_the_stream_cancels_and_the_runtime_stays_usable(ort, prompts):
    kw = {"strategy": "spd", "beam_width": 4, "gen_length": GEN}
    fresh = ort.generate(prompts, **kw)
    for chunk in ort.stream(prompts, **kw):
        assert chunk["token_ids"] or chunk["finish_reason"] is None
        break
    stream = ort.stream(prompts, **kw)
    next(stream)
    stream.close()
    again = ort.generate(prompts, **kw)
    assert [(r.token_ids, r.forwards) for r in again] == [(r.token_ids, r.forwards) for r in fresh]


def test_stream_checks_before_the_first_chunk(ort):
    with pytest.raises(UserError, match="empty prompt"):
        ort.stream([""])


def test_rows_text_is_decoded_incrementally(ort, prompts, monkeypatch):
    """With the byte tokenizer the loop never decodes a row's ids from the start: its text
    grows by the new ids only (ByteTokenizer.incremental), with the same chunks."""
    from dllm_deploy.models.tokenizer import ByteTokenizer
    kw = {"strategy": "threshold", "gen_length": GEN, "stop": ["\n\n"]}
    want = [(r.text, r.token_ids, r.finish_reason) for r in ort.generate(prompts, **kw)]
    calls = []
    monkeypatch.setattr(ByteTokenizer, "decode", lambda self, ids: calls.append(len(ids)) or "")
    assert [(r.text, r.token_ids, r.finish_reason) for r in ort.generate(prompts, **kw)] == want
    assert calls == []


@pytest.mark.parametrize("name", ["vanilla", "spd-lossless-vanilla"])
def test_a_cancelled_row_ends_at_once_and_the_others_are_unchanged(ort, prompts, name):
    """``cancel`` (asked after every forward): the row gets one last chunk, "cancelled", and no more;
    the other rows decode exactly as without it; alone, a cancelled row costs no further forward."""
    kw = {**STRATEGIES[name], "gen_length": GEN}
    want = ort.generate(prompts, **kw)
    asked = []

    def cancel():
        asked.append(1)
        return [0] if len(asked) == 2 else []
    out = collect(ort.stream(prompts, cancel=cancel, **kw))
    assert out[0][2][-1]["finish_reason"] == "cancelled"
    assert [c["finish_reason"] for c in out[0][2]].count("cancelled") == 1
    assert (out[1][0], out[1][1]) == (want[1].text, list(want[1].token_ids))
    chunks = list(ort.stream(prompts[:1], cancel=lambda: [0], **kw))
    assert chunks[-1]["finish_reason"] == "cancelled" and chunks[-1]["forwards"] <= 2
    assert want[0].forwards > 2
