"""Errors a user can cause. The CLI prints them as one line and exits with code 2."""
from __future__ import annotations

import errno
from pathlib import Path


class UserError(Exception):
    """Bad input from the user: a path, a file, a flag, a prompt. Never a bug of ours."""


_REASONS = {errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.ENOENT: "no such file",
            errno.EISDIR: "is a folder, not a file", errno.ENOTDIR: "a part of the path is not a folder"}


def file_error(path: str | Path, e: OSError, what: str = "") -> UserError:
    """One line for an OSError on a user's file, naming the file and the cause in plain words
    (``what`` says what the file is for, e.g. "manifest"), so no caller reports a permission
    problem as a missing file."""
    reason = _REASONS.get(e.errno) or (e.strerror or type(e).__name__).lower()
    return UserError(f"{path}: {what + ': ' if what else ''}{reason}")


def read_text(path: Path, not_utf8: str = "not UTF-8 text") -> str:
    """A user's text file as str: an unreadable file or one that is not UTF-8 is a UserError naming
    the file (and, for bad bytes, the first one and its offset)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise file_error(path, e) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: {not_utf8} (byte {data[e.start]:#04x} at offset {e.start})") from None
