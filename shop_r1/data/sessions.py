"""The session schema, the sources it is read from, and validation that names the source, row and field.

    {"session_id": str, "steps": [{"observation": str (simplified HTML), "action": {...}, "rationale": str|null}],
     "persona": str (optional: what is known of the shopper)}

Sessions come as JSONL (one session a line), a Parquet file, or a folder written by `datasets`' `save_to_disk`;
every source hands over the same plain dicts, so all go through the one validation below. `load_sessions` stops
at the first bad row by default; with `skip_bad_lines` it skips, counts and keeps the messages. Writing is JSONL
and atomic (temp file + rename), so a killed writer never leaves a truncated dataset.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shop_r1.atomic import open_atomic
from shop_r1.data.jsonl import SourceRow, read_jsonl
from shop_r1.errors import DataError
from shop_r1.types import Action, Session, Step

SESSION_SOURCES = ("a .jsonl file (one session a line), a .parquet file, or a folder written by datasets' "
                   "save_to_disk (a Dataset, or a DatasetDict with one split or a 'train' split)")
_ARROW_BATCH_ROWS = 1024  # Parquet/Arrow rows turned into Python objects at a time: memory stays flat on big files


class SessionFormatError(DataError):
    """A session row that does not fit the schema; the message starts with its place (`FILE:LINE` for JSONL,
    `SOURCE row N` otherwise), then the field."""


def _step_from_dict(obj: Any, where: str) -> Step:
    if not isinstance(obj, dict):
        raise SessionFormatError(f"{where}: expected an object")
    observation = obj.get("observation")
    if not isinstance(observation, str):
        raise SessionFormatError(f"{where}.observation: expected a string (the page's simplified HTML)")
    try:
        action = Action.from_dict(obj.get("action"), where=f"{where}.action")
    except ValueError as e:
        raise SessionFormatError(str(e)) from None
    rationale = obj.get("rationale")
    if rationale is not None and not isinstance(rationale, str):
        raise SessionFormatError(f"{where}.rationale: expected a string or null")
    return Step(observation=observation, action=action, rationale=rationale)


def session_from_dict(obj: Any, where: str) -> Session:
    """Validate one decoded row (a JSON line or an Arrow row); errors read `<where>: <field>: <problem>`."""
    if not isinstance(obj, dict):
        raise SessionFormatError(f"{where}: expected a JSON object")
    session_id = obj.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        raise SessionFormatError(f"{where}: session_id: expected a non-empty string")
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps:
        raise SessionFormatError(f"{where}: steps: expected a non-empty list")
    persona = obj.get("persona")
    if persona is not None and not isinstance(persona, str):
        raise SessionFormatError(f"{where}: persona: expected a string or null")
    return Session(session_id, tuple(_step_from_dict(s, f"{where}: steps[{i}]") for i, s in enumerate(steps)),
                   persona)


@dataclass(frozen=True)
class LoadedSessions:
    sessions: tuple[Session, ...]
    num_bad_lines: int = 0
    bad_lines: tuple[str, ...] = ()


def read_session_rows(path: str | Path) -> Iterator[SourceRow]:
    """The rows of any accepted source (`SESSION_SOURCES`), in order; the path alone picks the reader. A missing
    path, an unknown suffix or a folder/file that is not a dataset raises here, before any row is read."""
    p = Path(path)
    if p.is_dir():
        return _saved_dataset_rows(path)
    if not p.exists():
        raise FileNotFoundError(f"{path}: no such file or folder; sessions come as {SESSION_SOURCES}")
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        return read_jsonl(path)
    if suffix == ".parquet":
        return _parquet_rows(path)
    raise DataError(f"{path}: unknown sessions format ({suffix or 'no suffix'}); sessions come as {SESSION_SOURCES}")


def _parquet_rows(path: str | Path) -> Iterator[SourceRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except pa.ArrowInvalid as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None

    def batches() -> Iterator[Any]:
        with parquet:  # closed when the rows run out (or the reader is dropped)
            yield from parquet.iter_batches(batch_size=_ARROW_BATCH_ROWS)

    return _arrow_rows(str(path), batches())


def _saved_dataset_rows(path: str | Path) -> Iterator[SourceRow]:
    from datasets import DatasetDict, load_from_disk
    from datasets import config as ds_config

    p = Path(path)
    if not (p / ds_config.DATASET_STATE_JSON_FILENAME).is_file() \
            and not (p / ds_config.DATASETDICT_JSON_FILENAME).is_file():
        raise DataError(f"{path}: a folder, but not one written by datasets' save_to_disk (no "
                         f"{ds_config.DATASET_STATE_JSON_FILENAME} or {ds_config.DATASETDICT_JSON_FILENAME}); "
                         f"sessions come as {SESSION_SOURCES}")
    data = load_from_disk(str(p))
    source = str(path)
    if isinstance(data, DatasetDict):
        splits = list(data)
        if len(splits) != 1 and "train" not in splits:
            raise DataError(f"{path}: a DatasetDict with splits {splits}: sessions are read from its only split "
                             "or its 'train' split; save the split to use on its own (dd[name].save_to_disk(...))")
        split = splits[0] if len(splits) == 1 else "train"
        data, source = data[split], f"{path}[{split}]"
    # Raw Arrow batches, not the python formatter: the same to_pylist() decoding as the Parquet path.
    return _arrow_rows(source, data.with_format("arrow").iter(batch_size=_ARROW_BATCH_ROWS))


def _arrow_rows(source: str, batches: Iterable[Any]) -> Iterator[SourceRow]:
    """Rows of Arrow tables/record batches as the dicts and lists JSON decodes to. Arrow gives every row of a struct
    column all its fields, so a field a row lacks reads None, which the validation treats like an absent key."""
    index = 0
    for batch in batches:
        for value in batch.to_pylist():
            yield SourceRow(f"{source} row {index}", f"row {index}", value)
            index += 1


def load_sessions(path: str | Path, skip_bad_lines: bool = False) -> LoadedSessions:
    """Read and validate every session of `path`, any of `SESSION_SOURCES`. A bad row raises SessionFormatError
    naming it, or with `skip_bad_lines` is counted in `num_bad_lines` (the name is kept from JSONL-only days)."""
    sessions: list[Session] = []
    seen: dict[str, str] = {}
    bad: list[str] = []
    for row in read_session_rows(path):
        try:
            if row.error is not None:
                raise SessionFormatError(f"{row.where}: {row.error}")
            session = session_from_dict(row.value, row.where)
            if session.session_id in seen:
                raise SessionFormatError(f"{row.where}: session_id: {session.session_id!r} already used on "
                                         f"{seen[session.session_id]}")
        except SessionFormatError as e:
            if not skip_bad_lines:
                raise
            bad.append(str(e))
            continue
        seen[session.session_id] = row.place
        sessions.append(session)
    return LoadedSessions(tuple(sessions), len(bad), tuple(bad))


def write_jsonl_atomic(rows: Iterable[dict[str, Any]], path: str | Path) -> None:
    """Write JSONL aside and rename over `path` (shop_r1/atomic.py), so readers see the old file or the whole new
    one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_atomic(path) as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_sessions(sessions: Iterable[Session], path: str | Path) -> None:
    write_jsonl_atomic((s.to_dict() for s in sessions), path)


@dataclass(frozen=True)
class SessionSplit:
    train: tuple[Session, ...]
    test: tuple[Session, ...]


def split_sessions(sessions: Sequence[Session], test_fraction: float, seed: int) -> SessionSplit:
    """Hold out whole sessions (never single steps). At least one test session when test_fraction > 0."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    order = list(range(len(sessions)))
    random.Random(seed).shuffle(order)
    num_test = min(len(sessions) - 1, max(1, round(test_fraction * len(sessions)))) if test_fraction > 0 else 0
    test_ids = set(order[:num_test])
    return SessionSplit(train=tuple(s for i, s in enumerate(sessions) if i not in test_ids),
                        test=tuple(s for i, s in enumerate(sessions) if i in test_ids))


def persona_fields(session: Session) -> dict[str, str]:
    """The persona's `FIELD: value` lines as {FIELD: value} (empty without a persona)."""
    out = {}
    for line in (session.persona or "").splitlines():
        field, sep, value = line.partition(": ")
        if sep:
            out[field.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class HoldoutSplit:
    train: tuple[Session, ...]
    val: tuple[Session, ...]
    test: tuple[Session, ...]


def holdout_split(sessions: Sequence[Session], field: str, values: Sequence[str], val_fraction: float,
                  test_fraction: float, seed: int, key: str = "data.holdout") -> HoldoutSplit:
    """The out-of-distribution split (`data.holdout`): the sessions whose persona `field` is one of `values` are
    held out, split between validation and test in the ratio val_fraction : test_fraction (shuffled with `seed`);
    every other session trains. A value no session has is a `DataError` naming `key` and the values there are."""
    held = [s for s in sessions if persona_fields(s).get(field) in set(values)]
    seen = {persona_fields(s).get(field) for s in sessions} - {None}
    missing = [v for v in values if v not in seen]
    if missing:
        known = ", ".join(sorted(seen)[:30]) or "none: no session's persona has this field"
        raise DataError(f"{key}: no session has {field}: {' | '.join(missing)} (the values of {field!r}: {known})")
    if len(held) == len(sessions):
        raise DataError(f"{key}: every session has one of the held-out values: nothing is left to train on")
    # The held-out sessions divide as split_sessions divides any set: its "test" side is validation here.
    divided = split_sessions(held, val_fraction / (val_fraction + test_fraction), seed)
    held_ids = {id(s) for s in held}
    return HoldoutSplit(train=tuple(s for s in sessions if id(s) not in held_ids), val=divided.test,
                        test=divided.train)
