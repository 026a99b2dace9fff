"""The session schema (JSONL, one session a line) with validation that names file, line and field.

    {"session_id": str, "steps": [{"observation": str (simplified HTML), "action": {...}, "rationale": str|null}]}

`load_sessions` stops at the first bad line by default; with `skip_bad_lines` it skips, counts and keeps the
messages. Writing is atomic (temp file + rename), so a killed writer never leaves a truncated dataset.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from shop_r1.data.jsonl import read_jsonl
from shop_r1.types import Action, Session, Step


class SessionFormatError(ValueError):
    """A session line that does not fit the schema; the message starts with FILE:LINE: FIELD."""


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
    """Validate one decoded line; errors read `<where>: <field>: <problem>`."""
    if not isinstance(obj, dict):
        raise SessionFormatError(f"{where}: expected a JSON object")
    session_id = obj.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        raise SessionFormatError(f"{where}: session_id: expected a non-empty string")
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps:
        raise SessionFormatError(f"{where}: steps: expected a non-empty list")
    return Session(session_id, tuple(_step_from_dict(s, f"{where}: steps[{i}]") for i, s in enumerate(steps)))


@dataclass(frozen=True)
class LoadedSessions:
    sessions: tuple[Session, ...]
    num_bad_lines: int = 0
    bad_lines: tuple[str, ...] = ()


def load_sessions(path: str | Path, skip_bad_lines: bool = False) -> LoadedSessions:
    sessions: list[Session] = []
    seen: dict[str, int] = {}
    bad: list[str] = []
    for line in read_jsonl(path):
        try:
            if line.error is not None:
                raise SessionFormatError(f"{line.where}: {line.error}")
            session = session_from_dict(line.value, line.where)
            if session.session_id in seen:
                raise SessionFormatError(f"{line.where}: session_id: {session.session_id!r} already used on line "
                                         f"{seen[session.session_id]}")
        except SessionFormatError as e:
            if not skip_bad_lines:
                raise
            bad.append(str(e))
            continue
        seen[session.session_id] = int(line.where.rsplit(":", 1)[1])
        sessions.append(session)
    return LoadedSessions(tuple(sessions), len(bad), tuple(bad))


def write_jsonl_atomic(rows: Iterable[dict[str, Any]], path: str | Path) -> None:
    """Write JSONL aside and rename over `path`, so readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


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
