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
