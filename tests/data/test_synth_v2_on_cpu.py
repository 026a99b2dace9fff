"""The synthetic shop's version 2: a visible profile, a policy that reads only the prompt, a known ceiling."""

from collections import Counter

import pytest

from shop_r1.baselines import page_kind
from shop_r1.data.examples import build_rl_examples, build_sft_examples
from shop_r1.data.pages import element_names
from shop_r1.data.prompts import PERSONA_HEADER, render_observation, split_persona
from shop_r1.data.synth import synthesize_sessions
from shop_r1.data.synth.policy import oracle_action, oracle_exact, read_page
from shop_r1.data.synth.profile import Profile, parse_profile
from shop_r1.reward.rouge import rouge_l


def _examples(sessions, context="latest_step", persona=True, position="system"):
    return build_rl_examples(sessions, context, 10**9, lambda m: 0, persona=persona,
                             persona_position=position).examples


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


def test_the_persona_can_follow_the_current_page_instead():
    sessions = synthesize_sessions(20, seed=5, version=2)
    top, near = _examples(sessions), _examples(sessions, position="page")
    assert len(top) == len(near) > 20
    personas = {s.session_id: s.persona for s in sessions}
    for a, b in zip(top, near):
        profile = personas[b.session_id]
        assert PERSONA_HEADER not in b.prompt[0].content  # not in the system turn ...
        page, persona = split_persona(b.prompt[-1].content)
        assert persona == profile and b.prompt[-1].content.endswith(profile)  # ... but after the current page,
        assert page == a.prompt[-1].content  # which is otherwise the same turn
        assert all(PERSONA_HEADER not in m.content for m in b.prompt[1:-1])  # and nowhere in the history
        assert oracle_action(b.prompt) == oracle_action(a.prompt)
        html = page.split("\n", 1)[1]
        assert page_kind(b.prompt[-1].content) == page_kind(html)
        assert element_names(b.prompt[-1].content) == element_names(page)
    assert oracle_exact(near) == oracle_exact(top)
    # session-format SFT: the persona follows every page; split_persona inverts it
    conv = build_sft_examples(sessions[:1], persona_position="page").examples[0].messages
    users = [m.content for m in conv if m.role == "user"]
    assert all(split_persona(u)[1] == sessions[0].persona for u in users)
    assert split_persona(render_observation("<html></html>", 0)) == ("Page 1 (simplified HTML):\n<html></html>", None)
    with pytest.raises(ValueError, match="persona_position"):
        _examples(sessions[:1], position="bottom")


def test_version_and_noise_are_checked():
    with pytest.raises(ValueError, match="version"):
        synthesize_sessions(1, seed=0, version=5)
    with pytest.raises(ValueError, match="noise"):
        synthesize_sessions(1, seed=0, version=2, noise=1.5)
    assert synthesize_sessions(2, seed=0) == synthesize_sessions(2, seed=0, version=1)  # the default stays v1
