"""Bring your own data: JSONL, Parquet and `save_to_disk` folders load to the same sessions through the same
validation, and every error names the source and the row."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict

from shop_r1.data.sessions import SessionFormatError, load_sessions, write_sessions
from shop_r1.data.synth import synthesize_sessions
from shop_r1.types import Action, Session, Step


def _sessions() -> list[Session]:
    # The synthetic shop's sessions mix all three action types (so Arrow unifies click / type_and_submit /
    # terminate into one struct, with None for the fields a type lacks) and steps with and without rationales.
    sessions = synthesize_sessions(4, seed=0)
    no_rationale = Session("plain", (Step("<p/>", Action("click", "add_to_cart")), Step("<p/>", Action("terminate"))))
    return [*sessions, no_rationale]


def _rows(sessions: list[Session]) -> list[dict]:
    return [s.to_dict() for s in sessions]


def _write_parquet(rows: list[dict], path) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def _save_dataset(rows: list[dict], path) -> None:
    Dataset.from_list(rows).save_to_disk(str(path))


def test_jsonl_parquet_and_saved_dataset_load_the_same_sessions(tmp_path):
    sessions = _sessions()
    kinds = {a.action.type for s in sessions for a in s.steps}
    assert kinds == {"click", "type_and_submit", "terminate"}  # the fixture covers every struct shape
    write_sessions(sessions, tmp_path / "s.jsonl")
    _write_parquet(_rows(sessions), tmp_path / "s.parquet")
    _save_dataset(_rows(sessions), tmp_path / "ds")
    DatasetDict({"train": Dataset.from_list(_rows(sessions)), "test": Dataset.from_list(_rows(sessions[:1]))}) \
        .save_to_disk(str(tmp_path / "dd"))
    DatasetDict({"only": Dataset.from_list(_rows(sessions))}).save_to_disk(str(tmp_path / "one_split"))

    expected = tuple(sessions)
    for source in ("s.jsonl", "s.parquet", "ds", "dd", "one_split"):
        loaded = load_sessions(tmp_path / source)
        assert loaded.sessions == expected, source
        assert loaded.num_bad_lines == 0


# One bad row among good ones, and the field its error must name (the same messages as the JSONL tests).
BAD_ROWS = [
    ({"session_id": "y", "steps": [{"observation": "<p/>", "action": {"type": "scroll"}}]},
     r"steps\[0\]\.action\.type: expected one of"),
    ({"session_id": "y", "steps": [{"observation": "<p/>", "action": {"type": "click"}}]},
     r"steps\[0\]\.action\.name: a click action needs"),
    ({"session_id": "y", "steps": []}, "steps: expected a non-empty list"),
    ({"session_id": "", "steps": [{"observation": "<p/>", "action": {"type": "terminate"}}]},
     "session_id: expected a non-empty string"),
    ({"session_id": "y", "steps": [{"observation": None, "action": {"type": "terminate"}}]},
     r"steps\[0\]\.observation: expected a string"),
]


@pytest.mark.parametrize("bad, field", BAD_ROWS)
@pytest.mark.parametrize("kind", ["parquet", "saved_dataset"])
def test_a_malformed_row_names_the_source_and_row(tmp_path, kind, bad, field):
    good = _rows(_sessions())
    rows = [*good[:2], bad, *good[2:]]  # the bad one is row 2 (rows count from 0, as ds[2])
    if kind == "parquet":
        path, shown = tmp_path / "sessions.parquet", r"sessions\.parquet"
        _write_parquet(rows, path)
    else:
        path, shown = tmp_path / "sessions_ds", "sessions_ds"
        _save_dataset(rows, path)
    with pytest.raises(SessionFormatError, match=rf"{shown} row 2: {field}"):
        load_sessions(path)

    loaded = load_sessions(path, skip_bad_lines=True)
    assert loaded.sessions == tuple(_sessions()) and loaded.num_bad_lines == 1
    assert loaded.bad_lines[0].startswith(f"{path} row 2: ")


def test_duplicate_session_id_points_back_to_the_row(tmp_path):
    rows = _rows(_sessions())
    _write_parquet([*rows, rows[1]], tmp_path / "dup.parquet")
    n = len(rows)
    with pytest.raises(SessionFormatError, match=rf"dup\.parquet row {n}: session_id: .* already used on row 1$"):
        load_sessions(tmp_path / "dup.parquet")


def test_a_datasetdict_split_is_named_in_the_error(tmp_path):
    rows = _rows(_sessions())
    DatasetDict({"train": Dataset.from_list([*rows[:1], {**rows[1], "steps": []}]),
                 "test": Dataset.from_list(rows[2:])}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(SessionFormatError, match=r"dd\[train\] row 1: steps: expected a non-empty list"):
        load_sessions(tmp_path / "dd")


def test_a_datasetdict_without_one_split_or_train_is_refused(tmp_path):
    rows = _rows(_sessions())
    DatasetDict({"a": Dataset.from_list(rows), "b": Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"dd: a DatasetDict with splits \['a', 'b'\]: .*only split or its 'train'"):
        load_sessions(tmp_path / "dd")


def test_missing_path_and_unknown_kinds_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet: no such file or folder; sessions come as a \.jsonl"):
        load_sessions(tmp_path / "nope.parquet")
    (tmp_path / "s.csv").write_text("session_id,steps\n")
    with pytest.raises(ValueError, match=r"s\.csv: unknown sessions format \(\.csv\); sessions come as a \.jsonl"):
        load_sessions(tmp_path / "s.csv")
    (tmp_path / "sessions").write_text("{}\n")
    with pytest.raises(ValueError, match=r"sessions: unknown sessions format \(no suffix\)"):
        load_sessions(tmp_path / "sessions")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match=r"folder: a folder, but not one written by datasets' save_to_disk"):
        load_sessions(tmp_path / "folder")
    (tmp_path / "fake.parquet").write_text("not parquet at all\n")
    with pytest.raises(ValueError, match=r"fake\.parquet: not a readable Parquet file"):
        load_sessions(tmp_path / "fake.parquet")
