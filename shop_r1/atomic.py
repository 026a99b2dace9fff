"""Atomic, durable replacement of a file or a folder: readers see the old one or the whole new one, never a torn one.

The recipe, once for every writer of the project: write a temporary in the target's folder (a rename is atomic only
within one filesystem), flush and fsync it, rename it over the target, then fsync the folder, whose entry the rename
changed. After the call returns a power cut keeps the new content; any failure before the rename removes the
temporary and leaves the old content as it was.

    write_atomic(path, data)           a whole file from bytes or text
    with open_atomic(path) as f: ...   a file written piece by piece (JSONL streamed row by row)
    publish_atomically(tmp, final)     a complete folder (or file) the caller wrote aside (checkpoints, model folders)

Pure stdlib: any layer may use it.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal


def fsync_path(path: str | Path) -> None:
    """fsync a file, or a folder (which makes its entries, e.g. a rename into it, durable; Linux fsyncs a folder
    opened read-only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | Path) -> None:
    """fsync every file under `path`, then each folder after its entries, `path` itself last (`path` may be a file).

    A folder's fsync makes its entries (names) durable, not the files' data, hence files first. Symlinks are not
    followed."""
    path = Path(path)
    if not path.is_dir():
        fsync_path(path)
        return
    for folder, _, files in os.walk(path, topdown=False):  # bottom-up: a folder after its subfolders
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                fsync_path(Path(folder) / name)
        fsync_path(folder)


@contextmanager
def open_atomic(path: str | Path, mode: Literal["w", "wb"] = "w") -> Iterator[IO[Any]]:
    """A new file object whose content replaces `path` when the `with` block ends without an exception.

    "w": text, UTF-8; "wb": bytes. The temporary is `.<name>.<random>.tmp` beside `path` (created exclusively, with
    the umask's permissions); an exception in the block or in the write-out removes it and is re-raised, `path` is
    untouched. The folder must exist. A process killed mid-block leaves its temporary behind (never `path` torn)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"open_atomic: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, mode, encoding="utf-8" if mode == "w" else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Replace the file `path` with `data` (text is written as UTF-8), atomically and durably (see `open_atomic`)."""
    with open_atomic(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def publish_atomically(tmp: str | Path, final: str | Path) -> None:
    """Give the complete file or folder `tmp` the name `final`, durably: fsync_tree(tmp), rename, fsync the parent
    folder (which makes the rename itself durable). `tmp` and `final` share a folder.

    A folder already at `final` is renamed to `<final>.deleting` first, since a rename cannot replace a non-empty
    folder, and removed after; if the rename of `tmp` fails it is put back. (A kill between the two renames leaves
    `<final>.deleting` and no `final`: the caller's next write, or checkpoint.prune, clears such a leftover.)"""
    tmp, final = Path(tmp), Path(final)
    fsync_tree(tmp)
    aside = final.with_name(final.name + ".deleting") if final.is_dir() and not final.is_symlink() else None
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
        final.rename(aside)
    try:
        os.replace(tmp, final)
    except BaseException:
        if aside is not None:
            aside.rename(final)
        raise
    fsync_path(final.parent)
    if aside is not None:
        shutil.rmtree(aside)
