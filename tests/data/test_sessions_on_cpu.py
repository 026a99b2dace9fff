"""Session schema: round trip, errors that name file:line:field, skip-and-count, split by session."""

import json

import pytest

from shop_r1.data.sessions import SessionFormatError, load_sessions, split_sessions, write_sessions
from shop_r1.types import Action, Session, Step


def _session(sid: str, n: int = 2) -> Session:
    steps = [Step("<html>home</html>", Action("type_and_submit", "search_input", "red shoes"), "I need shoes.")]
    steps += [Step(f"<html>p{i}</html>", Action("click", f"search_results.shoe {i}.view_product"))
              for i in range(n - 2)]
    steps.append(Step("<html>last</html>", Action("terminate"), None))
    return Session(sid, tuple(steps))


def test_round_trip(tmp_path):
    sessions = [_session("a", 3), _session("b", 2)]
    write_sessions(sessions, tmp_path / "s.jsonl")
    assert load_sessions(tmp_path / "s.jsonl").sessions == tuple(sessions)
    # Unicode is kept as is, one session a line.
    lines = (tmp_path / "s.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["session_id"] == "a"


GOOD = {"session_id": "x", "steps": [{"observation": "<p/>", "action": {"type": "terminate"}}]}


@pytest.mark.parametrize("bad, field", [
    ("{nope", "not valid JSON"),
    ([1, 2], "expected a JSON object"),
    ({"steps": GOOD["steps"]}, "session_id"),
    ({"session_id": "y", "steps": []}, "steps: expected a non-empty list"),
    ({"session_id": "y", "steps": [{"action": {"type": "terminate"}}]}, r"steps\[0\]\.observation"),
    ({"session_id": "y", "steps": [{"observation": "<p/>", "action": {"type": "scroll"}}]},
     r"steps\[0\]\.action\.type"),
    ({"session_id": "y", "steps": [{"observation": "<p/>", "action": {"type": "click"}}]},
     r"steps\[0\]\.action\.name"),
    ({"session_id": "y", "steps": [{"observation": "<p/>", "action": {"type": "type_and_submit", "name": "q"}}]},
     r"steps\[0\]\.action\.text"),
    ({"session_id": "y", "steps": [{"observation": "<p/>", "action": {"type": "terminate"}, "rationale": 5}]},
     r"steps\[0\]\.rationale"),
    (GOOD, "already used on line 1"),  # duplicate session_id
])
def test_bad_line_names_file_line_and_field(tmp_path, bad, field):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + (bad if isinstance(bad, str) else json.dumps(bad)) + "\n")
    with pytest.raises(SessionFormatError, match=rf"s\.jsonl:2: .*{field}"):
        load_sessions(path)


def test_skip_and_count_bad_lines(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join([json.dumps(GOOD), "{broken", "", json.dumps({"session_id": "z", "steps": []}),
                               json.dumps({**GOOD, "session_id": "w"})]) + "\n")
    loaded = load_sessions(path, skip_bad_lines=True)
    assert [s.session_id for s in loaded.sessions] == ["x", "w"]
    assert loaded.num_bad_lines == 2
    assert loaded.bad_lines[0].startswith(f"{path}:2:") and loaded.bad_lines[1].startswith(f"{path}:4:")


def test_split_is_by_session_and_deterministic():
    sessions = [_session(f"s{i}") for i in range(20)]
    a = split_sessions(sessions, 0.2, seed=3)
    b = split_sessions(sessions, 0.2, seed=3)
    assert a == b and len(a.test) == 4 and len(a.train) == 16
    assert not {s.session_id for s in a.test} & {s.session_id for s in a.train}
    assert split_sessions(sessions, 0.2, seed=4).test != a.test
    assert len(split_sessions(sessions[:3], 0.01, 0).test) == 1  # a test set is never empty when asked for


def test_non_utf8_line_is_named_and_skippable(tmp_path):
    """A line with bytes that are not UTF-8 (a file cut mid-character, a Latin-1 export) names its place; with
    data.skip_bad_lines it is counted and the lines after it still load."""
    path = tmp_path / "s.jsonl"
    good = json.dumps(GOOD).encode()
    path.write_bytes(good + b"\n" + b'{"session_id": "caf\xe9"}\n' + json.dumps({**GOOD, "session_id": "w"}).encode())
    with pytest.raises(SessionFormatError, match=r"s\.jsonl:2: not UTF-8 \(byte 0xe9 at column 20\)"):
        load_sessions(path)
    loaded = load_sessions(path, skip_bad_lines=True)
    assert [s.session_id for s in loaded.sessions] == ["x", "w"] and loaded.num_bad_lines == 1


def test_empty_sessions_file_is_an_error_naming_it(tmp_path, tiny_model_dir):
    from shop_r1.config import DataConfig
    from shop_r1.data.build import build_datasets

    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    assert load_sessions(path).sessions == ()
    with pytest.raises(ValueError, match=r"empty\.jsonl: 0 usable session\(s\).*needs at least 2"):
        build_datasets(path, tmp_path / "out", tiny_model_dir, DataConfig())
