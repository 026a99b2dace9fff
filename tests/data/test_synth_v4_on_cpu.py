"""The synthetic shop's version 4: version 3 with the searches limit in words of its own ("thrice") and the patience
line last in the profile, so each limit can be fetched by what it is or by its distance from the answer
(shop_r1/data/synth/profile.py, wording 4)."""

import collections
import dataclasses
import re

import pytest

from shop_r1.data.examples import build_rl_examples
from shop_r1.data.prompts import apply_chat_template, render_action, split_persona
from shop_r1.data.synth import synthesize_sessions
from shop_r1.data.synth.policy import Listing, PageView, decide, oracle_action, oracle_exact
from shop_r1.data.synth.profile import Profile, parse_profile
from shop_r1.types import Action, Message

TENT = Profile(category="outdoor", noun="tent", feature="waterproof", budget=100, brand=None, uses_filters=False,
               min_rating=4.0, max_views=2, max_searches=3, buy_now=True, wording=4)
_NUMBER = re.compile(r"\b(one|two|three|four|twice|thrice|fourfold)\b")
PRODUCTS = ("", "one", "two", "three")
SEARCHES_3, SEARCHES_4 = ("", "", "two", "three", "four"), ("", "", "twice", "thrice", "fourfold")


def _examples(sessions, position="page"):
    return build_rl_examples(sessions, "latest_step", 10**9, lambda m: 0, persona=True, instructions="short",
                             persona_position=position).examples


def test_same_shoppers_and_actions_as_version_3_with_the_patience_line_reworded_and_last():
    v3, v4 = synthesize_sessions(120, seed=3, version=3), synthesize_sessions(120, seed=3, version=4)
    changed = 0
    for a, b in zip(v3, v4):
        assert b.session_id == a.session_id.replace("synth3-", "synth4-")
        assert [s.action for s in a.steps] == [s.action for s in b.steps]
        assert [s.observation for s in a.steps] == [s.observation for s in b.steps]
        pa, pb = parse_profile(a.persona), parse_profile(b.persona)
        assert (pa.wording, pb.wording) == (3, 4) and dataclasses.replace(pb, wording=3) == pa
        old = f"searches {SEARCHES_3[pa.max_searches]}"
        new = f"searches {SEARCHES_4[pa.max_searches]}"
        lines = a.persona.splitlines()
        patience = lines.pop(7)
        assert patience == f"Patience: products {PRODUCTS[pa.max_views]}, {old}"
        assert b.persona.splitlines() == [*lines, patience.replace(old, new)]
        for x, y in zip(a.steps, b.steps):
            assert y.rationale == x.rationale.replace(old, new)
            changed += x.rationale != y.rationale
    assert changed > 200


def test_profile_round_trips_and_hand_checked_words():
    for s in synthesize_sessions(60, seed=1, version=4):
        assert parse_profile(s.persona).render() == s.persona
    assert TENT.render().splitlines()[-2:] == ["Checkout: buy now", "Patience: products two, searches thrice"]
    assert parse_profile(TENT.render()) == TENT
    four = dataclasses.replace(TENT, max_views=1, max_searches=4)
    assert four.render().endswith("\nPatience: products one, searches fourfold")
    assert parse_profile(four.render()) == four
    for bad in ("searches thrice times", "searches 3"):
        with pytest.raises(ValueError, match="cannot read"):
            parse_profile(TENT.render().replace("searches thrice", bad))
    hits = (Listing("Kelty Dry Tent", 90.0, 4.5, "search_results.Kelty Dry Tent.view_product"),)
    opened = [Action("type_and_submit", "search_input", "waterproof tent"),
              Action("click", "search_results.A.view_product"), Action("click", "back_to_results")]
    d = decide(TENT, PageView("results", results=hits), opened)
    assert d.action == Action("type_and_submit", "search_input", "tent")
    assert d.rationale == ("My patience: products two, searches thrice; I've opened 1 and searched 1; I want a "
                           "waterproof tent under $100, and nothing here fits, so I'll search for \"tent\".")


def test_each_limit_is_the_only_word_of_its_kind_and_the_line_ends_the_prompt():
    """In the current turn (page and profile) the only number words are the two limits, from disjoint sets, and the
    patience line is the turn's end."""
    examples = _examples(synthesize_sessions(80, seed=4, version=4))
    assert len(examples) > 200
    for e in examples:
        p = parse_profile(split_persona(e.prompt[-1].content)[1])
        found = _NUMBER.findall(e.prompt[-1].content)
        assert found == [PRODUCTS[p.max_views], SEARCHES_4[p.max_searches]]
        assert e.prompt[-1].content.endswith(f"\nPatience: {p.patience}")


def test_each_limit_is_the_same_number_of_tokens_before_its_copy_in_every_prompt():
    """With the shop's own tokenizer (built as the main job builds it): from the answer's " products" / " searches"
    back to the value after the same word in the profile, the distance does not depend on the session."""
    from shop_r1.models.tiny import default_corpus, train_tokenizer

    tok = train_tokenizer(default_corpus(num_sessions=300, seed=7919, version=4), 4096)
    distances = collections.Counter()
    for e in _examples(synthesize_sessions(60, seed=4, version=4)):
        if not (e.target_rationale or "").startswith("My patience"):
            continue
        answer = Message("assistant", render_action(e.target, e.target_rationale))
        ids = tok.tokenize(apply_chat_template(tok, [*e.prompt, answer], add_generation_prompt=False))
        start = max(i for i, t in enumerate(ids) if t == "<|im_start|>")
        one = []
        for word in ("Ġproducts", "Ġsearches"):
            in_answer = ids.index(word, start)
            in_profile = max(i for i in range(start) if ids[i] == word)
            assert ids[in_answer + 1] == ids[in_profile + 1]  # one token, the same
            one.append(in_answer - in_profile)
        distances[tuple(one)] += 1
    assert sum(distances.values()) > 100 and len(distances) == 1, distances


def test_the_oracle_reads_version_4_prompts_and_its_ceiling_is_one_minus_noise():
    clean = _examples(synthesize_sessions(150, seed=2, version=4, noise=0.0))
    assert len(clean) > 300 and oracle_exact(clean) == 1.0
    assert all(oracle_action(e.prompt) == e.target for e in clean[:50])
    noisy = [_examples(synthesize_sessions(300, seed=5, version=v, noise=0.2), position="system") for v in (3, 4)]
    assert 0.72 < oracle_exact(noisy[1]) < 0.88 and oracle_exact(noisy[1]) == oracle_exact(noisy[0])
