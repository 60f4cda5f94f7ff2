r"""Prompt text as the user typed it: backslash escapes (``generate --escapes``) and text that is
not valid Unicode.

    decode_escapes(r"a\tb\u00e9")   'a\tbé' -- non-ASCII text stays as typed; a bad escape is a UserError
    valid_text("ab\udcffcd")        'ab\ufffdcd' -- bytes that were not UTF-8 become U+FFFD

Pure functions with no dependencies, so the CLI, the tokenizers and the fuzz tests share them.
"""
from __future__ import annotations

import re

from .errors import UserError

#: single-character escapes and what they stand for
SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}
#: escapes followed by a fixed number of hex digits: \xHH, \uHHHH, \UHHHHHHHH
HEX = {"x": 2, "u": 4, "U": 8}
KNOWN = r"""known: \n \t \r \0 \\ \" \' \xHH \uHHHH \UHHHHHHHH"""
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD. Python keeps command-line bytes that
    are not UTF-8 as such surrogates (surrogateescape); they cannot be encoded, so a prompt with
    bad bytes is decoded with one replacement character per bad byte instead of failing."""
    return _SURROGATE.sub("\ufffd", text)


def decode_escapes(text: str, flag: str = "--escapes") -> str:
    r"""Interpret \n \t \r \0 \\ \" \' \xHH \uHHHH \UHHHHHHHH in ``text``; every other character,
    ASCII or not, is kept as it is. An unknown or incomplete escape, a trailing backslash or a
    code point that is not a character is a UserError naming ``flag``."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 == len(text):
            raise UserError(f"{flag}: the prompt ends with a lone backslash (write \\\\ for one backslash)")
        e = text[i + 1]
        if e in SIMPLE:
            out.append(SIMPLE[e])
            i += 2
            continue
        if e not in HEX:
            raise UserError(f"{flag}: unknown escape, a backslash then {e!r} at offset {i} ({KNOWN})")
        digits = text[i + 2:i + 2 + HEX[e]]
        if len(digits) != HEX[e] or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise UserError(f"{flag}: incomplete escape \\{e} at offset {i} (it takes {HEX[e]} hex digits)")
        code = int(digits, 16)
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise UserError(f"{flag}: escape \\{e}{digits} at offset {i} is not a Unicode character")
        out.append(chr(code))
        i += 2 + HEX[e]
    return "".join(out)
