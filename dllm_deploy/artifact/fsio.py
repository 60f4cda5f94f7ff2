"""Crash-safe file-system writes for everything dllm-deploy writes in place of a user's path.

At every instant a target is either wholly the old version or wholly the new one:

    atomic_write(path, data)          a file: temp file beside it, fsync, os.replace, fsync the folder
    temp_dir(target)                  a hidden scratch folder beside a target, marked as ours
    replace_dir(new, target, scratch) a folder: old aside (into scratch), new in; roll back on failure
    remove_temp_dir(scratch)          delete a scratch folder, its marker last
    lock_target(target)               one writer per target (flock on a hidden ``.NAME.lock`` beside it)
    clean_stale(target)               scratch folders a killed writer left behind (call under the lock)

Only folders named like ours AND holding our marker naming the target are ever removed, so a
user's look-alike folder is never touched.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..errors import UserError

MARKER = ".dllm-deploy-temp"   # written into every scratch folder; its text names the target


def _fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (the rename is atomic, its persistence is not)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: bytes | str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so that readers (and a crash) see the old file or the whole
    new one, never a half-written one. The temp file is removed when anything fails."""
    path = Path(path)
    blob = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _temp_pattern(target: Path) -> re.Pattern:
    """Names ``tempfile.mkdtemp(prefix=".NAME.tmp-")`` gives (8 random characters), nothing else."""
    return re.compile(rf"\.{re.escape(target.name)}\.tmp-[a-z0-9_]{{8}}")


def _marker_text(target: Path) -> str:
    return f"dllm-deploy scratch folder for {target.name}\n"


def temp_dir(target: Path) -> Path:
    """A new hidden scratch folder beside ``target`` (same file system, so renames are atomic),
    marked so that ``clean_stale`` may remove it if this process is killed."""
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    (scratch / MARKER).write_text(_marker_text(target))
    return scratch


def remove_temp_dir(scratch: Path) -> None:
    """Delete a scratch folder; the marker goes last so a removal cut short is still recognised
    as ours (and finished by the next ``clean_stale``). Errors are left for that next run."""
    with contextlib.suppress(OSError):
        for child in scratch.iterdir():
            if child.name == MARKER:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                os.unlink(child)
        os.unlink(scratch / MARKER)
        os.rmdir(scratch)


def replace_dir(new: Path, target: Path, scratch: Path) -> None:
    """Put folder ``new`` at ``target``. An existing target is first renamed to ``scratch/old``
    (the caller deletes it with the scratch folder); if renaming ``new`` in fails, the old one is
    renamed back. Both renames stay inside one folder, so each is atomic."""
    old = scratch / "old"
    had_old = os.path.lexists(target)
    if had_old:
        os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        if had_old:
            os.rename(old, target)
        raise
    _fsync_dir(target.parent)


def clean_stale(target: Path) -> list[Path]:
    """Remove scratch folders of ``target`` left by a killed writer. Call while holding
    ``lock_target(target)``: no live writer of this target has one then."""
    pattern, text, removed = _temp_pattern(target), _marker_text(target), []
    for p in target.parent.iterdir():
        if not pattern.fullmatch(p.name) or p.is_symlink() or not p.is_dir():
            continue
        try:
            ours = (p / MARKER).read_text() == text
        except (OSError, UnicodeDecodeError):
            ours = False
        if ours:
            remove_temp_dir(p)
            removed.append(p)
    return removed


@contextlib.contextmanager
def lock_target(target: Path):
    """Hold an exclusive lock on ``target`` for the block: an flock on ``.NAME.lock`` beside it
    (the lock file stays; the kernel drops the lock when the process dies, even on SIGKILL).
    A second writer fails at once in one line naming the target and the holder's pid."""
    lock = target.parent / f".{target.name}.lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UserError(f"{target}: cannot write in {target.parent} ({e.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UserError(f"{target}: another dllm-deploy process is writing it (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
