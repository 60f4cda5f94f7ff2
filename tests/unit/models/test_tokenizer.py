import pytest

from dllm_deploy.errors import UserError
from dllm_deploy.models.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer


def test_byte_tokenizer_roundtrip_and_stops_at_eos():
    t = ByteTokenizer()
    ids = t.encode("héllo")
    assert ids == list("héllo".encode())
    assert t.decode(ids + [t.EOS, ord("x")]) == "héllo"
    assert t.decode([t.MASK, ord("a"), t.PAD]) == "a"


def test_hf_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "<eos>": 3}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(tmp_path / "tokenizer.json"))
    t = load_tokenizer(tmp_path, eos_token_id=3)
    assert isinstance(t, HFTokenizer)
    assert t.encode("hello world") == [1, 2]
    assert t.decode([1, 2, 3, 1]) == "hello world"


def test_bad_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(UserError, match="not a valid tokenizer.json"):
        load_tokenizer(tmp_path, eos_token_id=3)


def test_no_tokenizer_json_means_bytes(tmp_path):
    assert isinstance(load_tokenizer(tmp_path, 0), ByteTokenizer)
