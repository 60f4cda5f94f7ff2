"""stream.py: what a chunk releases as a row's final ids grow (docs/streaming.md, "Chunks"), on
the byte tokenizer: UTF-8 and stop-string hold-back, finish reasons, the ids alongside the text."""
from dllm_deploy.models.tokenizer import ByteTokenizer
from dllm_deploy.runtime.stream import RowText, held_back, ids_within, stop_at

TOK = ByteTokenizer()


def feed(text: RowText, ids: list[int]) -> list[tuple[str, list[int], str | None]]:
    """The updates for ids growing one at a time (as the loop's reports would)."""
    return [text.update(ids[:n]) for n in range(1, len(ids) + 1)]


def b(s: str) -> list[int]:
    return list(s.encode("utf-8"))


def test_stop_at_and_held_back():
    assert stop_at("abcXYdef", ("de", "XY")) == 3 and stop_at("abc", ("x",)) is None
    assert held_back("abc", ()) == 0 and held_back("ab\ufffd", ()) == 1
    assert held_back("ab E", ("END",)) == 1 and held_back("ab EN", ("END", "NX")) == 2
    assert held_back("ab EN\ufffd", ("END",)) == 3         # the U+FFFD first, then the stop prefix
    assert held_back("END", ("END",)) == 0                 # a whole stop string is found, not held


def test_multibyte_character_split_across_tokens_is_never_split_across_chunks():
    t = RowText(TOK.decode, TOK.EOS, (), budget=100)
    ids = b("h€!")                                          # € is 3 bytes
    out = feed(t, ids)
    assert [d for d, _, _ in out] == ["h", "", "", "€", "!"]
    assert [i for _, i, _ in out] == [[104], [], [], b("€"), [33]]
    assert all(r is None for _, _, r in out)
    assert "".join(d for d, _, _ in out) == "h€!" and sum((i for _, i, _ in out), []) == ids


def test_stop_string_spanning_chunks_cuts_text_and_ids():
    t = RowText(TOK.decode, TOK.EOS, ("END", "zz"), budget=100)
    out = feed(t, b("abENx END"))
    assert [d for d, _, _ in out] == ["a", "b", "", "", "ENx", " ", "", "", ""]   # "EN" held, then released
    assert [i for _, i, _ in out] == [[97], [98], [], [], b("ENx"), [32], [], [], []]
    assert [r for _, _, r in out] == [None] * 8 + ["stop"]          # the update that completes "END"
    assert t.text == "abENx " and t.sent == 6                       # the ids wholly before the stop string


def test_earliest_stop_string_wins_and_ids_lie_wholly_before_it():
    t = RowText(TOK.decode, TOK.EOS, ("c", "ab"), budget=100)
    assert t.update(b("xabc")) == ("x", b("x"), "stop")
    t = RowText(TOK.decode, TOK.EOS, ("!",), budget=100)
    assert t.update(b("é!")) == ("é", b("é"), "stop")


def test_eos_and_budget_finish_and_flush_the_held_back_tail():
    t = RowText(TOK.decode, TOK.EOS, ("STOP",), budget=100)
    assert t.update(b("aST")) == ("a", [97], None)
    assert t.update(b("aST") + [TOK.EOS]) == ("ST", [83, 84, TOK.EOS], "eos")   # EOS is one of the ids
    t = RowText(TOK.decode, TOK.EOS, (), budget=3)
    assert t.update(b("a")) == ("a", [97], None)
    assert t.update(b("a") + [0xE2, 0x82]) == ("\ufffd", [0xE2, 0x82], "length")   # incomplete: flushed as is


def test_ids_within():
    ids = b("a€")
    assert ids_within(TOK.decode, ids, "a€", 0) == 4
    assert ids_within(TOK.decode, ids[:3], "a", 0) == 1     # "a\ufffd" is no prefix of "a"
    assert ids_within(TOK.decode, ids, "", 0) == 0


def _reference_update(state: dict, decode, eos_id, stop, budget, ids):
    """RowText.update as docs/streaming.md states it: every id decoded again at every update."""
    text = decode(ids)
    cut = stop_at(text, stop)
    if cut is not None:
        reason, text = "stop", text[:cut]
    elif eos_id in ids:
        reason = "eos"
    else:
        reason = "length" if len(ids) >= budget else None
    if reason is None:
        text = text[:len(text) - held_back(text, stop)]
    n = len(ids) if reason in ("eos", "length") else ids_within(decode, ids, text, state["sent"])
    delta, new = text[len(state["text"]):], ids[state["sent"]:n]
    state.update(text=text, sent=n)
    return delta, new, reason


def _random_ids(rng, n: int) -> list[int]:
    """Bytes of ASCII, multi-byte and broken UTF-8, now and then EOS or another special id."""
    pool = b("ab E\nEN€é") + [0x80, 0xE2, 0x82, 0xF0, 0x9F, 0xFF]
    return [TOK.EOS if rng.random() < 0.03 else TOK.MASK if rng.random() < 0.02 else int(rng.choice(pool))
            for _ in range(n)]


def test_byte_text_is_decode_of_every_prefix():
    import numpy as np
    rng = np.random.default_rng(0)
    for _ in range(3000):
        ids = _random_ids(rng, int(rng.integers(0, 24)))
        text, at = TOK.incremental(), 0
        for k in sorted(rng.choice(len(ids) + 1, size=min(3, len(ids) + 1), replace=False).tolist()) + [len(ids)]:
            text.extend(ids[at:k])
            at = k
            assert text.text == TOK.decode(ids[:k])
        for start in range(len(ids) + 1):       # within: the prefix counts whose text lies in a given prefix
            for cut in {len(text.text), len(text.text) // 2, max(len(text.text) - 1, 0)}:
                assert text.within(text.text[:cut], start) == ids_within(TOK.decode, ids, text.text[:cut], start)


def test_incremental_and_full_decoding_make_the_reference_chunks():
    """Random rows grown a few ids at a time, with stop strings (multi-byte, overlapping) and
    budgets: the byte tokenizer's incremental text and a plain decode give the reference's
    updates, update for update."""
    import numpy as np
    rng = np.random.default_rng(1)
    stops = [(), ("END",), ("\n",), ("EN", "€"), ("é!", "b E"), ("aa",)]
    for _ in range(2000):
        ids = _random_ids(rng, int(rng.integers(1, 40)))
        stop, budget = stops[int(rng.integers(len(stops)))], int(rng.integers(1, 45))
        rows = [RowText(TOK.decode, TOK.EOS, stop, budget), RowText(TOK.incremental(), TOK.EOS, stop, budget)]
        ref, n = {"text": "", "sent": 0}, 0
        while n < len(ids):
            n = min(len(ids), n + int(rng.integers(1, 5)))
            want = _reference_update(ref, TOK.decode, TOK.EOS, stop, budget, ids[:n])
            assert [t.update(ids[:n]) for t in rows] == [want, want], (ids, stop, budget, n)
            if want[2]:
                break


def test_row_text_decodes_each_id_once():
    """The loop's row text takes only the ids new since the last update (its cost per forward
    follows the new tokens, not the row's length)."""
    class Counting:
        def __init__(self):
            self.inner, self.fed = TOK.incremental(), 0
            self.text, self.settled = "", 0

        def extend(self, ids):
            self.fed += len(ids)
            self.inner.extend(ids)
            self.text, self.settled = self.inner.text, self.inner.settled

        def within(self, text, start):
            return self.inner.within(text, start)

    counting = Counting()
    t, ids = RowText(counting, TOK.EOS, ("zz",), budget=1000), b("héllo wörld, " * 20)
    out = feed(t, ids)
    assert counting.fed == len(ids)
    assert "".join(d for d, _, _ in out) == TOK.decode(ids) and sum((i for _, i, _ in out), []) == ids
