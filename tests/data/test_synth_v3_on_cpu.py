"""The synthetic shop's version 3: version 2's shoppers and actions, worded so that every profile fact a decision
needs can be copied into the rationale after the same word as in the profile (shop_r1/data/synth/profile.py)."""

import dataclasses
import re

import pytest

from shop_r1.data.examples import build_rl_examples
from shop_r1.data.prompts import split_persona
from shop_r1.data.synth import synthesize_sessions
from shop_r1.data.synth.policy import Listing, PageView, decide, oracle_action, oracle_exact, read_page
from shop_r1.data.synth.profile import Profile, parse_profile
from shop_r1.data.synth.profiled import NOISE_RATIONALES
from shop_r1.types import Action

TENT = Profile(category="outdoor", noun="tent", feature="waterproof", budget=100, brand=None, uses_filters=False,
               min_rating=4.0, max_views=2, max_searches=3, buy_now=True, wording=3)


def _examples(sessions, position="page"):
    return build_rl_examples(sessions, "latest_step", 10**9, lambda m: 0, persona=True,
                             persona_position=position).examples


def test_same_shoppers_and_actions_as_version_2_in_other_words():
    v2, v3 = synthesize_sessions(120, seed=3, version=2), synthesize_sessions(120, seed=3, version=3)
    for a, b in zip(v2, v3):
        assert b.session_id == a.session_id.replace("synth2-", "synth3-")
        assert [s.action for s in a.steps] == [s.action for s in b.steps]
        assert [s.observation for s in a.steps] == [s.observation for s in b.steps]
        pa, pb = parse_profile(a.persona), parse_profile(b.persona)
        assert (pa.wording, pb.wording) == (2, 3) and dataclasses.replace(pb, wording=2) == pa
    shared = {*NOISE_RATIONALES.values(), "I have what I came for, so I'll check out now.",
              "I've spent long enough on this, so I'll stop here.",
              "This page is not what I was looking for, so I'll leave."}
    pairs = [(x.rationale, y.rationale) for a, b in zip(v2, v3) for x, y in zip(a.steps, b.steps)]
    assert len(pairs) > 500
    assert all((x == y) == (x in shared) for x, y in pairs)


def test_profile_text_round_trips_and_a_disagreeing_wants_line_is_refused():
    for s in synthesize_sessions(60, seed=1, version=3):
        assert parse_profile(s.persona).render() == s.persona
    text = TENT.render()
    assert text.splitlines()[3:5] == ["Wants: a waterproof tent under $100", "Brand: any"]
    assert "Patience: products two, searches three" in text
    branded = dataclasses.replace(TENT, brand="Osprey")
    assert "Brand: prefer Osprey" in branded.render() and parse_profile(branded.render()) == branded
    with pytest.raises(ValueError, match="disagrees"):
        parse_profile(text.replace("Wants: a waterproof tent", "Wants: a dry tent"))
    with pytest.raises(ValueError, match="cannot read"):
        parse_profile(text.replace("products two", "products 2"))
    with pytest.raises(ValueError, match="wording"):
        import random

        from shop_r1.data.synth.profile import make_profile
        make_profile(random.Random(0), wording=5)


def test_rationales_hand_checked():
    """One page per branch, the sentence written out by hand."""
    hits = (Listing("Osprey Dry Tent", 80.0, 4.5, "search_results.Osprey Dry Tent.view_product"),
            Listing("Osprey Waterproof Tent X", 120.0, 4.5, "search_results.Osprey Waterproof Tent X.view_product"),
            Listing("Kelty Waterproof Tent", 90.0, 4.5, "search_results.Kelty Waterproof Tent.view_product"))
    results = PageView("results", results=hits)
    searched = [Action("type_and_submit", "search_input", "waterproof tent")]
    d = decide(TENT, results, searched)
    assert d.action == Action("click", "search_results.Kelty Waterproof Tent.view_product")
    assert d.rationale == ("My patience: products two, searches three; I've opened 0 and searched 1; I want a "
                           "waterproof tent under $100, and the Kelty Waterproof Tent at $90.00 fits, so I'll take a "
                           "closer look.")
    opened = [*searched, Action("click", hits[2].name), Action("click", "back_to_results")]
    d = decide(TENT, results, opened)
    assert d.action == Action("type_and_submit", "search_input", "tent")
    assert d.rationale == ("My patience: products two, searches three; I've opened 1 and searched 1; I want a "
                           "waterproof tent under $100, and nothing here fits, so I'll search for \"tent\".")
    out_of_searches = [*opened, Action("type_and_submit", "search_input", "tent"),
                       Action("type_and_submit", "search_input", "tent under 100")]
    d = decide(TENT, results, out_of_searches)
    assert d.action == Action("terminate")
    assert d.rationale.endswith("and nothing here fits, and that is all my searches, so I'll leave.")
    two_opened = [*searched, Action("click", "search_results.A.view_product"),
                  Action("click", "search_results.B.view_product")]
    d = decide(TENT, results, two_opened)
    assert (d.action, d.rationale) == (Action("terminate"), "My patience: products two, searches three; I've opened 2 "
                                       "and searched 1, and that is all I open, so I'll stop here.")
    product = PageView("product", product=Listing("Kelty Waterproof Tent", 90.0, 3.9, ""), product_brand="Kelty")
    d = decide(TENT, product, opened[:2])
    assert d.action == Action("click", "back_to_results")
    assert d.rationale == ("I want a waterproof tent under $100, and this one at $90.00 with 3.9 stars is under my 4.0 "
                           "stars, so I'll go back to the results.")
    good = dataclasses.replace(product, product=Listing("Kelty Waterproof Tent", 90.0, 4.6, ""))
    assert decide(TENT, good, opened[:2]).rationale.endswith("with 4.6 stars fits, so I'll buy it now.")
    assert decide(TENT, PageView("home"), []).rationale == ("I want a waterproof tent under $100, so I'll search for "
                                                            "\"waterproof tent\".")


def test_every_fact_a_rationale_needs_follows_the_same_word_in_the_profile():
    """The property version 3 exists for: the patience phrase and the wanted phrase are copied verbatim from the
    profile, so each value follows the same token there as in the rationale."""
    checked = 0
    for s in synthesize_sessions(80, seed=4, version=3, noise=0.0):
        p = parse_profile(s.persona)
        for step in s.steps:
            for fact in re.findall(r"My patience: (products \w+, searches \w+)", step.rationale):
                assert f"Patience: {fact}" in s.persona and fact == p.patience
                checked += 1
            if "I want " in step.rationale:
                assert f"Wants: {p.want}" in s.persona and f"I want {p.want}" in step.rationale
                checked += 1
    assert checked > 500


def test_the_oracle_reads_version_3_prompts_and_its_ceiling_is_one_minus_noise():
    clean = _examples(synthesize_sessions(150, seed=2, version=3, noise=0.0))
    assert len(clean) > 300 and oracle_exact(clean) == 1.0
    noisy = _examples(synthesize_sessions(300, seed=5, version=3, noise=0.2), position="system")
    assert 0.72 < oracle_exact(noisy) < 0.88
    # same examples as version 2's, so the same ceiling
    v2 = _examples(synthesize_sessions(300, seed=5, version=2, noise=0.2), position="system")
    assert oracle_exact(noisy) == oracle_exact(v2)
    e = clean[0]
    assert parse_profile(split_persona(e.prompt[-1].content)[1]).wording == 3
    assert oracle_action(e.prompt) == e.target
    assert read_page(split_persona(e.prompt[-1].content)[0].split("\n", 1)[1]).kind in {"results", "product", "cart"}
