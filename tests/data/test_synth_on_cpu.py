"""The synthetic shop: determinism, the Table A1 action mix, names that exist on their page, speed."""

import html
import re
import time
from collections import Counter

from shop_r1.data.sessions import write_sessions
from shop_r1.data.synth import synthesize_sessions

NAME_RE = re.compile(r'name="([^"]*)"')


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    write_sessions(synthesize_sessions(50, seed=1), tmp_path / "a.jsonl")
    write_sessions(synthesize_sessions(50, seed=1), tmp_path / "b.jsonl")
    write_sessions(synthesize_sessions(50, seed=2), tmp_path / "c.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()
    # Asking for more sessions does not change the first ones.
    assert synthesize_sessions(60, seed=1)[:50] == synthesize_sessions(50, seed=1)


def test_action_mix_close_to_table_a1():
    sessions = synthesize_sessions(2000, seed=0)
    counts = Counter(step.action.type for s in sessions for step in s.steps)
    total = sum(counts.values())
    mix = {k: v / total for k, v in counts.items()}
    # Table A1 (train): click 36.5%, type_and_submit 38.4%, terminate 25.1%
    assert abs(mix["click"] - 0.365) < 0.05, mix
    assert abs(mix["type_and_submit"] - 0.384) < 0.05, mix
    assert abs(mix["terminate"] - 0.251) < 0.05, mix


def test_every_action_name_is_on_its_page_and_names_are_unique():
    for session in synthesize_sessions(300, seed=5):
        assert session.steps[0].action.type == "type_and_submit"  # every session starts with a search on home
        assert 'name="nav.home"' in session.steps[0].observation
        for step in session.steps:
            names = NAME_RE.findall(step.observation)
            assert len(names) == len(set(names)), f"duplicate names on a page of {session.session_id}"
            if step.action.type != "terminate":
                assert step.action.name in names, (session.session_id, step.action)
            assert step.rationale and step.rationale[0].isupper()
        # terminate, if any, ends the session
        kinds = [s.action.type for s in session.steps]
        assert "terminate" not in kinds[:-1]


def test_queries_follow_the_hidden_intent_and_pages_reflect_refinements():
    sessions = synthesize_sessions(300, seed=9)
    refined = 0
    for s in sessions:
        for prev, nxt in zip(s.steps, s.steps[1:]):
            if prev.action.type == "type_and_submit":
                assert f'value="{html.escape(prev.action.text)}"' in nxt.observation  # the next page shows the query
            if prev.action.name.startswith("refinements.brand."):
                assert f'name="{prev.action.name}" checked' in nxt.observation
                refined += 1
    assert refined > 5


def test_fast():
    start = time.perf_counter()
    synthesize_sessions(2000, seed=11)
    assert time.perf_counter() - start < 5.0  # a sanity bound; ~0.4 s on the 2-core CI machine
