"""The synthetic shop's version 4: version 3 with the searches limit in words of its own ("searches thrice"), so the
two patience limits share no word (shop_r1/data/synth/profile.py, wording 4)."""

import dataclasses
import re

import pytest

from shop_r1.data.examples import build_rl_examples
from shop_r1.data.prompts import split_persona
from shop_r1.data.synth import synthesize_sessions
from shop_r1.data.synth.policy import Listing, PageView, decide, oracle_action, oracle_exact
from shop_r1.data.synth.profile import Profile, parse_profile
from shop_r1.types import Action

TENT = Profile(category="outdoor", noun="tent", feature="waterproof", budget=100, brand=None, uses_filters=False,
               min_rating=4.0, max_views=2, max_searches=3, buy_now=True, wording=4)
_NUMBER = re.compile(r"\b(one|two|three|four|twice|thrice)\b")


def test_same_shoppers_and_actions_as_version_3_with_the_searches_limit_reworded():
    v3, v4 = synthesize_sessions(120, seed=3, version=3), synthesize_sessions(120, seed=3, version=4)
    words = {2: "twice", 3: "thrice", 4: "four times"}
    changed = 0
    for a, b in zip(v3, v4):
        assert b.session_id == a.session_id.replace("synth3-", "synth4-")
        assert [s.action for s in a.steps] == [s.action for s in b.steps]
        assert [s.observation for s in a.steps] == [s.observation for s in b.steps]
        pa, pb = parse_profile(a.persona), parse_profile(b.persona)
        assert (pa.wording, pb.wording) == (3, 4) and dataclasses.replace(pb, wording=3) == pa
        old = f"searches {['', '', 'two', 'three', 'four'][pa.max_searches]}"
        new = f"searches {words[pa.max_searches]}"
        assert b.persona == a.persona.replace(old, new)
        for x, y in zip(a.steps, b.steps):
            assert y.rationale == x.rationale.replace(old, new)
            changed += x.rationale != y.rationale
    assert changed > 200


def test_profile_round_trips_and_hand_checked_words():
    for s in synthesize_sessions(60, seed=1, version=4):
        assert parse_profile(s.persona).render() == s.persona
    assert "Patience: products two, searches thrice" in TENT.render()
    assert parse_profile(TENT.render()) == TENT
    four = dataclasses.replace(TENT, max_views=1, max_searches=4)
    assert "Patience: products one, searches four times" in four.render() and parse_profile(four.render()) == four
    with pytest.raises(ValueError, match="cannot read"):
        parse_profile(TENT.render().replace("searches thrice", "searches thrice times"))
    hits = (Listing("Kelty Dry Tent", 90.0, 4.5, "search_results.Kelty Dry Tent.view_product"),)
    opened = [Action("type_and_submit", "search_input", "waterproof tent"),
              Action("click", "search_results.A.view_product"), Action("click", "back_to_results")]
    d = decide(TENT, PageView("results", results=hits), opened)
    assert d.action == Action("type_and_submit", "search_input", "tent")
    assert d.rationale == ("My patience: products two, searches thrice; I've opened 1 and searched 1; I want a "
                           "waterproof tent under $100, and nothing here fits, so I'll search for \"tent\".")


def test_each_limit_is_the_only_word_of_its_kind_in_the_prompt():
    """The property version 4 exists for: in the current turn (page and profile), the only number words are the two
    limits, and the products limit's word is never one the searches limit uses (and the reverse)."""
    examples = build_rl_examples(synthesize_sessions(80, seed=4, version=4), "latest_step", 10**9, lambda m: 0,
                                 persona=True, persona_position="page").examples
    assert len(examples) > 200
    for e in examples:
        p = parse_profile(split_persona(e.prompt[-1].content)[1])
        found = _NUMBER.findall(e.prompt[-1].content)
        assert found == [["", "one", "two", "three"][p.max_views], ["", "", "twice", "thrice", "four"][p.max_searches]]
        assert found[0] in {"one", "two", "three"} and found[1] in {"twice", "thrice", "four"}


def test_the_oracle_reads_version_4_prompts_and_its_ceiling_is_one_minus_noise():
    clean = build_rl_examples(synthesize_sessions(150, seed=2, version=4, noise=0.0), "latest_step", 10**9,
                              lambda m: 0, persona=True, persona_position="page").examples
    assert len(clean) > 300 and oracle_exact(clean) == 1.0
    assert all(oracle_action(e.prompt) == e.target for e in clean[:50])
    noisy = [build_rl_examples(synthesize_sessions(300, seed=5, version=v, noise=0.2), "latest_step", 10**9,
                               lambda m: 0, persona=True, persona_position="system").examples for v in (3, 4)]
    assert 0.72 < oracle_exact(noisy[1]) < 0.88 and oracle_exact(noisy[1]) == oracle_exact(noisy[0])
