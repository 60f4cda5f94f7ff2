"""Tokenizers: the byte tokenizer of the tiny dLLM, and Hugging Face ``tokenizer.json`` files."""
from __future__ import annotations

import codecs
import json
import shutil
from pathlib import Path

from ..errors import UserError, file_error
from ..text import valid_text


class ByteTokenizer:
    """Bytes 0-255 are their own ids; specials follow: mask=256, eos=257, pad=258."""

    kind = "byte"
    MASK, EOS, PAD = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return list(valid_text(text).encode("utf-8"))

    def decode(self, ids) -> str:
        out = bytearray()
        for i in ids:
            i = int(i)
            if i == self.EOS:
                break
            if 0 <= i < 256:
                out.append(i)
        return out.decode("utf-8", errors="replace")

    def incremental(self) -> ByteText:
        """``decode`` of a growing list of ids at a cost per new id (a streamed row's text)."""
        return ByteText(self.EOS)

    def to_manifest(self) -> dict:
        return {"kind": "byte", "mask": self.MASK, "eos": self.EOS, "pad": self.PAD}


class ByteText:
    """``ByteTokenizer.decode`` of ids that arrive a few at a time (runtime/stream.py's row text):
    the bytes go through an incremental UTF-8 decoder, so ``text`` == decode(every id so far)
    at a cost per new id, and the text of every prefix of the ids is kept as (its settled
    characters, the text of its pending bytes) for ``within``."""

    def __init__(self, eos_id: int = ByteTokenizer.EOS):
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._eos, self._ended = eos_id, False       # after EOS, ids decode to nothing
        self._settled = ""          # characters no later byte changes
        self._tail = ""             # the pending bytes of an incomplete character, decoded ("" or U+FFFD)
        self._marks = [(0, "")]     # after n ids: (len(settled), tail)

    @property
    def text(self) -> str:
        return self._settled + self._tail

    @property
    def settled(self) -> int:
        """Characters of ``text`` that no later id can change."""
        return len(self._settled)

    def extend(self, ids) -> None:
        settled, tail = self._settled, self._tail
        for i in ids:
            i = int(i)
            if self._ended:
                pass
            elif i == self._eos:
                self._ended = True
            elif i < 128 and i >= 0 and not tail:            # ASCII after a complete character: itself
                settled += chr(i)
            elif 0 <= i < 256:
                settled += self._utf8.decode(bytes((i,)))
                pending = self._utf8.getstate()[0]
                tail = pending.decode("utf-8", errors="replace") if pending else ""
            self._marks.append((len(settled), tail))
        self._settled, self._tail = settled, tail

    def within(self, text: str, start: int) -> int:
        """The largest count n >= ``start`` of the ids whose decoded text is a prefix of ``text``
        (itself a prefix of ``self.text``)."""
        for n in range(len(self._marks) - 1, start, -1):
            at, tail = self._marks[n]
            if at + len(tail) <= len(text) and text.startswith(tail, at):
                return n
        return start


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library (no network)."""

    kind = "hf"

    def __init__(self, path: str | Path, eos_token_id: int):
        try:
            from tokenizers import Tokenizer
        except ImportError:  # pragma: no cover - a declared dependency
            raise UserError("the 'tokenizers' package is needed to read tokenizer.json") from None
        try:
            with open(path, "rb"):   # names the cause the library's message leaves out
                pass
            self._tok = Tokenizer.from_file(str(path))
        except OSError as e:
            raise file_error(path, e, "tokenizer") from None
        except Exception as e:  # the library raises a bare Exception on a bad file
            raise UserError(f"{path}: not a valid tokenizer.json ({e})") from None
        self.path = Path(path)
        self.EOS = eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(valid_text(text), add_special_tokens=False).ids

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.EOS in ids:
            ids = ids[: ids.index(self.EOS)]
        return self._tok.decode(ids, skip_special_tokens=True)

    def write_files(self, src: Path, dst: Path) -> None:
        """The files an artifact carries: tokenizer.json, and the tokenizer_config.json that the C++
        runtime's onnxruntime-extensions needs beside it (the model folder's, else one naming the
        EOS token, with nothing added on encode)."""
        shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
        if (src / "tokenizer_config.json").exists():
            shutil.copy(src / "tokenizer_config.json", dst / "tokenizer_config.json")
            return
        config = {"tokenizer_class": "GPT2Tokenizer", "eos_token": self._tok.id_to_token(self.EOS),
                  "bos_token": None, "unk_token": None, "add_bos_token": False, "add_eos_token": False,
                  "clean_up_tokenization_spaces": False}
        (dst / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    def to_manifest(self) -> dict:
        return {"kind": "hf", "file": "tokenizer.json", "config": "tokenizer_config.json",
                "cpp": "onnxruntime-extensions"}


def load_tokenizer(folder: str | Path | None, eos_token_id: int):
    """``tokenizer.json`` in the folder if present, else the byte tokenizer."""
    if folder is not None and (Path(folder) / "tokenizer.json").exists():
        return HFTokenizer(Path(folder) / "tokenizer.json", eos_token_id)
    return ByteTokenizer()
