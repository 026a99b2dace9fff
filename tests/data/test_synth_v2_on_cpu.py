"""The synthetic shop's version 2: a visible profile, a policy that reads only the prompt, a known ceiling."""

from collections import Counter

import pytest

from shop_r1.data.examples import build_rl_examples
from shop_r1.data.prompts import PERSONA_HEADER
from shop_r1.data.synth import synthesize_sessions
from shop_r1.data.synth.policy import oracle_action, oracle_exact, read_page
from shop_r1.data.synth.profile import Profile, parse_profile
from shop_r1.reward.rouge import rouge_l


def _examples(sessions, context="latest_step", persona=True):
    return build_rl_examples(sessions, context, 10**9, lambda m: 0, persona=persona).examples


def test_deterministic_and_stable_when_more_sessions_are_asked_for():
    assert synthesize_sessions(30, seed=3, version=2) == synthesize_sessions(30, seed=3, version=2)
    assert synthesize_sessions(40, seed=3, version=2)[:30] == synthesize_sessions(30, seed=3, version=2)
    assert synthesize_sessions(30, seed=4, version=2) != synthesize_sessions(30, seed=3, version=2)


def test_profile_round_trips_through_its_text():
    for s in synthesize_sessions(50, seed=1, version=2):
        profile = parse_profile(s.persona)
        assert isinstance(profile, Profile)
        assert profile.render() == s.persona


@pytest.mark.parametrize("context", ["latest_step", "whole_session"])
def test_without_noise_the_oracle_reading_only_the_prompt_is_always_right(context):
    examples = _examples(synthesize_sessions(150, seed=2, version=2, noise=0.0), context)
    assert len(examples) > 300
    wrong = [e.example_id for e in examples if oracle_action(e.prompt) != e.target]
    assert wrong == []
    assert oracle_exact(examples) == 1.0


def test_with_noise_the_oracle_misses_exactly_the_noisy_steps():
    sessions = synthesize_sessions(300, seed=5, version=2, noise=0.2)
    examples = _examples(sessions)
    # A noisy step never equals the policy's action, and its rationale is one of the noise sentences.
    from shop_r1.data.synth.profiled import NOISE_RATIONALES

    noisy = sum(e.target_rationale in NOISE_RATIONALES.values() for e in examples)
    assert oracle_exact(examples) == pytest.approx(1 - noisy / len(examples))
    assert 0.72 < oracle_exact(examples) < 0.88  # about 1 - noise


def test_class_mix_is_near_the_papers_and_no_constant_answer_wins():
    examples = _examples(synthesize_sessions(400, seed=0, version=2))
    mix = Counter(e.target.type for e in examples)
    shares = {k: v / len(examples) for k, v in mix.items()}
    assert 0.35 < shares["click"] < 0.6
    assert 0.2 < shares["type_and_submit"] < 0.45
    assert 0.12 < shares["terminate"] < 0.3
    assert oracle_exact(examples) > 0.85 > 3 * shares["terminate"]


def test_results_pages_hold_near_identical_product_names():
    """Where ROUGE-L and DARS matter: a clicked product shares the page with others whose names score >= 0.75."""
    sessions = synthesize_sessions(200, seed=7, version=2)
    clicks, close = 0, 0
    for s in sessions:
        for step in s.steps:
            if step.action.type == "click" and step.action.name.endswith(".view_product"):
                page = read_page(step.observation)
                others = [r.name for r in page.results if r.name != step.action.name]
                clicks += 1
                close += any(rouge_l(o, step.action.name) >= 0.75 for o in others)
    assert clicks > 100
    assert close / clicks > 0.3


def test_the_persona_heads_the_prompt_and_can_be_left_out():
    session = synthesize_sessions(1, seed=0, version=2)[0]
    with_p = _examples([session])[0].prompt[0].content
    without = _examples([session], persona=False)[0].prompt[0].content
    assert PERSONA_HEADER in with_p and session.persona in with_p
    assert PERSONA_HEADER not in without
    with pytest.raises(ValueError, match="no shopper profile"):
        oracle_action(_examples([session], persona=False)[0].prompt)


def test_version_and_noise_are_checked():
    with pytest.raises(ValueError, match="version"):
        synthesize_sessions(1, seed=0, version=3)
    with pytest.raises(ValueError, match="noise"):
        synthesize_sessions(1, seed=0, version=2, noise=1.5)
    assert synthesize_sessions(2, seed=0) == synthesize_sessions(2, seed=0, version=1)  # the default stays v1
