"""Reading JSONL with every problem named by FILE:LINE (blank lines are ignored)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shop_r1.errors import DataError


@dataclass(frozen=True)
class SourceRow:
    """One record of a data source, decoded to plain dicts and lists, not yet validated (JSONL lines here; the
    Parquet and dataset readers of shop_r1/data/sessions.py yield the same)."""

    where: str
    """The prefix of every error about it: `FILE:LINE` for JSONL, else `SOURCE row N` (N from 0, as in `ds[N]`)."""
    place: str
    """`line N` / `row N`: what a later duplicate (e.g. of a session_id) points back to."""
    value: Any
    error: str | None = None
    """Why the record could not be decoded at all (value is None then)."""


def read_jsonl(path: str | Path) -> Iterator[SourceRow]:
    """Every non-blank line, decoded on its own: a line that is not UTF-8 or not JSON is reported with its place
    (the lines after it still load). A `.gz` file is read through gzip."""
    import gzip

    with (gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")) as f:
        for lineno, raw in enumerate(f, 1):
            where, place = f"{path}:{lineno}", f"line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield SourceRow(where, place, None, f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
                continue
            if not line.strip():
                continue
            try:
                yield SourceRow(where, place, json.loads(line))
            except json.JSONDecodeError as e:
                yield SourceRow(where, place, None, f"not valid JSON ({e.msg} at column {e.colno})")


def read_jsonl_objects(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, object) per line; a line that is not a JSON object raises ValueError naming FILE:LINE."""
    for line in read_jsonl(path):
        if line.error is not None:
            raise DataError(f"{line.where}: {line.error}")
        if not isinstance(line.value, dict):
            # A bad line of data, reported like the other bad lines (callers catch ValueError), not a TypeError.
            raise DataError(f"{line.where}: expected a JSON object")  # noqa: TRY004
        yield line.where, line.value
