"""The public OPeRA dataset's action table (Parquet) -> our sessions.

Columns used: session_id, action_id, timestamp, action_type (click / input / terminate), semantic_id,
simplified_html, rationale, input_text, and `persona` when present. Mapping: click -> click(name=semantic_id); input ->
type_and_submit(name=semantic_id, text=input_text); terminate -> terminate. Rows are grouped by session and ordered by
timestamp, then action_id. OPeRA also logs action types the paper's action space does not have (e.g. scroll); those
rows are skipped and counted per type, never silently. A row missing a value its action needs is an error naming the
session, the action and the column.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shop_r1.errors import DataError
from shop_r1.types import Action, Session, Step

REQUIRED_COLUMNS = ("session_id", "action_id", "timestamp", "action_type", "semantic_id", "simplified_html",
                    "rationale", "input_text")
OPTIONAL_COLUMNS = ("persona",)
"""Read when present: the shopper's persona text (OPeRA's persona survey, joined per session), carried to
`Session.persona` so that prompts can be persona-conditioned as in Customer-R1 (the first non-empty value of a
session)."""


@dataclass(frozen=True)
class ConvertedOpera:
    sessions: tuple[Session, ...]
    num_skipped_rows: int = 0
    skipped_by_type: dict[str, int] = field(default_factory=dict)


def _need_str(row: dict[str, Any], column: str, where: str) -> str:
    value = row.get(column)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: column {column!r} must be a non-empty string for a {row['action_type']} row, "
                         f"got {value!r}")
    return value


def _row_to_step(row: dict[str, Any], where: str) -> Step | None:
    kind = row["action_type"]
    if kind == "click":
        action = Action("click", name=_need_str(row, "semantic_id", where))
    elif kind == "input":
        text = row.get("input_text")
        if not isinstance(text, str):
            raise DataError(f"{where}: column 'input_text' must be a string for an input row, got {text!r}")
        action = Action("type_and_submit", name=_need_str(row, "semantic_id", where), text=text)
    elif kind == "terminate":
        action = Action("terminate")
    else:
        return None
    html = row.get("simplified_html")
    if not isinstance(html, str):
        raise DataError(f"{where}: column 'simplified_html' must be a string, got {type(html).__name__}")
    rationale = row.get("rationale")
    rationale = rationale if isinstance(rationale, str) and rationale.strip() else None
    return Step(observation=html, action=action, rationale=rationale)


def convert_opera(parquet_path: str | Path) -> ConvertedOpera:
    import pyarrow.parquet as pq

    table = pq.read_table(parquet_path)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(f"{parquet_path}: missing OPeRA columns {missing} (has {table.column_names})")
    optional = [c for c in OPTIONAL_COLUMNS if c in table.column_names]
    rows = table.select(list(REQUIRED_COLUMNS) + optional).to_pylist()
    by_session: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_session.setdefault(str(row["session_id"]), []).append(row)
    skipped: Counter[str] = Counter()
    sessions = []
    for session_id, session_rows in by_session.items():
        session_rows.sort(key=lambda r: (r["timestamp"], str(r["action_id"])))
        steps = []
        for row in session_rows:
            where = f"{parquet_path}: session {session_id}, action {row['action_id']}"
            step = _row_to_step(row, where)
            if step is None:
                skipped[str(row["action_type"])] += 1
                continue
            steps.append(step)
        if steps:
            personas = [r["persona"] for r in session_rows
                        if isinstance(r.get("persona"), str) and r["persona"].strip()]
            sessions.append(Session(session_id, tuple(steps), personas[0].strip() if personas else None))
    return ConvertedOpera(tuple(sessions), sum(skipped.values()), dict(skipped))
