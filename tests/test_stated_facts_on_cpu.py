"""experiments/stated_facts.py on hand-made answers: each count below is worked out by hand."""

import dataclasses
import json

import pytest

from experiments.stated_facts import render, stated_facts
from shop_r1.data.synth.profile import Profile

P3 = Profile(category="outdoor", noun="tent", feature="waterproof", budget=100, brand=None, uses_filters=False,
             min_rating=4.0, max_views=2, max_searches=3, buy_now=True, wording=3)
P2 = dataclasses.replace(P3, wording=2)


def _answer(rationale, kind="terminate", **action):
    return json.dumps({"rationale": rationale, "action": {"type": kind, **action}})


def test_counts_by_hand():
    search = {"name": "search_input", "text": "tent"}
    records = [
        # v3, limits right, searches left (1 < 3), types: follows the rule
        ("a", _answer("My patience: products two, searches three; I've opened 0 and searched 1; I want a waterproof "
                      "tent under $100, and nothing here fits, so I'll search for \"tent\".", "type_and_submit",
                      **search)),
        # v3, products limit wrong, stated searches used up (3 of three) but types: the rule broken
        ("a", _answer("My patience: products one, searches three; I've opened 0 and searched 3; I want a dry tent "
                      "under $100, and nothing here fits, so I'll search for \"tent\".", "type_and_submit", **search)),
        # v3, stated searches left (1 of four) but leaves: broken; searches limit wrong
        ("a", _answer("My patience: products two, searches four; I've opened 0 and searched 1; I want a waterproof "
                      "tent under $100, and nothing here fits, and that is all my searches, so I'll leave.")),
        # v2 wording, right limits, used up (2 of 2 stated) and leaves: follows; want right
        ("b", _answer("I've opened 1 of my 2 products and made 2 of my 2 searches, and found no waterproof tent under "
                      "$100; nothing here is a waterproof tent under $100.")),
        ("a", "not json"),
        ("a", _answer("Something here caught my eye, so I'll click it.", "click", name="x")),
    ]
    r = stated_facts({"a": P3, "b": P2}, [{"example_id": k, "response": v} for k, v in records])
    assert (r["answers"], r["unparsed"], r["limits_stated"]) == (6, 1, 4)
    assert (r["products_limit_right"], r["searches_limit_right"]) == (3, 2)  # b: max_views 2, max_searches 3 -> 1 of 2
    assert (r["want_stated"], r["want_right"]) == (4, 3)
    assert r["nothing_fits"] == {"searches_left": {"type_and_submit": 1, "terminate": 1},
                                 "searches_used_up": {"type_and_submit": 1, "terminate": 1}}
    assert r["rule_broken_share"] == 0.5
    assert "the rule broken on 50 %" in render("x", r)


def test_a_prediction_of_another_run_is_named():
    with pytest.raises(ValueError, match="'zz'.*no such example"):
        stated_facts({"a": P3}, [{"example_id": "zz", "response": _answer("x")}])


def test_version_4_limits_are_read_in_their_own_words():
    p4 = dataclasses.replace(P3, max_searches=4, wording=4)
    records = [
        # v4, both limits right ("four times"), searches left (2 < 4), types: follows
        ("a", _answer("My patience: products two, searches four times; I've opened 0 and searched 2; I want a "
                      "waterproof tent under $100, and nothing here fits, so I'll search for \"tent\".",
                      "type_and_submit", name="search_input", text="tent")),
        # v4, searches limit wrong (twice = 2, used up at 2) and leaves: follows its own numbers
        ("a", _answer("My patience: products one, searches twice; I've opened 0 and searched 2; I want a waterproof "
                      "tent under $100, and nothing here fits, and that is all my searches, so I'll leave.")),
    ]
    r = stated_facts({"a": p4}, [{"example_id": k, "response": v} for k, v in records])
    assert (r["limits_stated"], r["products_limit_right"], r["searches_limit_right"]) == (2, 1, 1)
    assert r["nothing_fits"] == {"searches_left": {"type_and_submit": 1}, "searches_used_up": {"terminate": 1}}
    assert r["rule_broken_share"] == 0.0
