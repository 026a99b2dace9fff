"""Reward functions in TRL's shape (shop_r1/reward/functions.py): batched, weighted, added to the Shop-R1 terms,
logged as reward/<name>, and refused by name before any actor starts when they cannot be loaded or miscount."""

import pytest
import torch

from shop_r1.algo.step_rewards import StepRewards, step_advantages
from shop_r1.config import ConfigError, load_config, validate
from shop_r1.reward.functions import (
    RewardFunctionError,
    RewardTerm,
    default_terms,
    reward_function_problems,
    term_metrics,
    terms_of,
)
from shop_r1.reward.scorer import score_response
from shop_r1.reward.worker import RewardWorker
from shop_r1.types import Action, Prompt, ScoreRequest

CLICK = Action("click", "Add to cart")
RIGHT = '{"rationale": "It is what I want.", "action": {"type": "click", "name": "Add to cart"}}'
STOP = '{"rationale": "Done here.", "action": {"type": "terminate"}}'


def short_answer(prompts, completions, target, **kwargs):
    """1 for a response under 80 characters, None (does not apply) for a terminate target."""
    return [None if t.type == "terminate" else float(len(c) < 80) for c, t in zip(completions, target)]


def echo_ids(prompts, completions, example_id, **kwargs):
    """The columns arrive by name: 1.0 where the prompt's example_id is 'ex1'."""
    return [float(e == "ex1") for e in example_id]


def sees_logprobs(prompts, completions, logprobs, **kwargs):
    """Asks for the engine logprobs by naming the parameter."""
    return [0.0 if lp is None else 1.0 for lp in logprobs]


def one_too_few(prompts, completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def raises_on_stop(prompts, completions, **kwargs):
    if any("terminate" in c for c in completions):
        raise RuntimeError("no terminate here")
    return [1.0] * len(completions)


NOT_CALLABLE = 3


def _requests(*pairs):
    return [ScoreRequest(text, target, prompt=Prompt(f"ex{i}", (1, 2), target)) for i, (text, target) in
            enumerate(pairs)]


def test_a_weighted_function_adds_to_the_shop_r1_total_and_none_adds_nothing():
    cfg = load_config(None, [])
    worker = RewardWorker(cfg.reward, terms=[RewardTerm("short_answer", short_answer, 0.5)])
    requests = _requests((RIGHT, CLICK), (STOP, Action("terminate")))
    scored = worker.score(requests)
    base = [score_response(r.response, r.target, cfg.reward) for r in requests]
    # len(RIGHT) = 87 >= 80: value 0.0, adds 0.5 * 0 = 0; the terminate target: None, adds nothing.
    assert len(RIGHT) == 87
    assert [r.total for r in scored] == [base[0].total + 0.0, base[1].total]
    assert [(t.name, t.value, t.weight) for r in scored for t in r.terms] == [("short_answer", 0.0, 0.5),
                                                                              ("short_answer", None, 0.5)]
    # The Shop-R1 terms are untouched.
    assert [r.action_type for r in scored] == [b.action_type for b in base]


def test_columns_arrive_by_name_and_logprobs_only_when_asked():
    cfg = load_config(None, [])
    worker = RewardWorker(cfg.reward, terms=[RewardTerm("echo_ids", echo_ids, 2.0),
                                             RewardTerm("sees_logprobs", sees_logprobs, 1.0)])
    scored = worker.score(_requests((RIGHT, CLICK), (RIGHT, CLICK)))
    base = score_response(RIGHT, CLICK, cfg.reward).total
    # ex0: 2 * 0 + 1 * 0 (no logprobs); ex1: 2 * 1 + 0.
    assert [r.total for r in scored] == [base + 0.0, base + 2.0]
    assert [r.plugin_total for r in scored] == [0.0, 2.0]


def test_metrics_are_the_mean_over_the_applied_values_and_their_share():
    cfg = load_config(None, [])
    worker = RewardWorker(cfg.reward, terms=[RewardTerm("short_answer", short_answer, 1.0)])
    short = '{"rationale": "ok", "action": {"type": "click", "name": "Add to cart"}}'  # 71 characters
    scored = worker.score(_requests((RIGHT, CLICK), (short, CLICK), (STOP, Action("terminate")),
                                    (STOP, Action("terminate"))))
    # Values 0, 1, None, None: mean over the two that apply 0.5; they are 2 of 4 responses.
    assert term_metrics(scored) == {"reward/short_answer": 0.5, "reward/short_answer_applied": 0.5}


def test_a_function_that_raises_flags_only_the_responses_it_raised_on():
    cfg = load_config(None, [])
    worker = RewardWorker(cfg.reward, terms=[RewardTerm("raises_on_stop", raises_on_stop, 1.0)])
    scored = worker.score(_requests((RIGHT, CLICK), (STOP, Action("terminate"))))
    assert scored[0].error is None and scored[0].total == score_response(RIGHT, CLICK, cfg.reward).total + 1.0
    assert scored[1].error == "reward/raises_on_stop: RuntimeError: no terminate here" and scored[1].total == 0.0


def test_a_wrong_count_is_a_loud_error_naming_the_function():
    worker = RewardWorker(load_config(None, []).reward, terms=[RewardTerm("one_too_few", one_too_few, 1.0)])
    with pytest.raises(RewardFunctionError, match="'one_too_few' returned 1 values for 2 completions"):
        worker.score(_requests((RIGHT, CLICK), (STOP, Action("terminate"))))


def test_the_default_list_is_the_shop_r1_reward():
    """format 0.5 + action (0.3 type + 0.2 attribute + DARS 1000 * ROUGE-L 1.0 = 1000.5) + alpha * s (no logprobs:
    s = 0) = 1001.0, the scorer's total; a format-invalid answer scores 0 in each."""
    cfg = load_config(None, [])
    terms = default_terms(cfg.reward)
    assert [(t.name, t.weight) for t in terms] == [("format", 1.0), ("action", 1.0), ("self_certainty", 0.005)]
    for text, want in ((RIGHT, 1001.0), ("not json", 0.0)):
        values = [t.fn(prompts=[None], completions=[text], target=[CLICK], page_names=[None])[0] for t in terms]
        total = sum(t.weight * v for t, v in zip(terms, values))
        assert total == pytest.approx(score_response(text, CLICK, cfg.reward).total) == pytest.approx(want)


def test_tied_shop_r1_terms_with_a_plugin_spread_carry_signal_when_self_certainty_cannot_break_ties():
    cfg = load_config(None, ["rl.self_certainty_breaks_ties=false"])
    worker = RewardWorker(cfg.reward, terms=[RewardTerm("echo_ids", echo_ids, 1.0)])
    rewards = tuple(worker.score(_requests((RIGHT, CLICK), (RIGHT, CLICK))))
    adv = step_advantages(StepRewards((rewards,), (0,)), cfg.rl.advantage_config(cfg.reward))
    # Shop-R1 terms tie (1001 each); the plug-in gives 0 and 1: group std of (1001, 1002) = 0.7071.
    assert not bool(adv.zero_signal[0])
    assert torch.allclose(adv.advantages, torch.tensor([[-0.5, 0.5]], dtype=torch.float64) / (2 ** -0.5 + 1e-6))


def test_reward_functions_load_from_the_config_with_their_weights():
    cfg = load_config(None, [f"reward.functions=[{{fn: '{__name__}:short_answer', weight: 0.25}}]"])
    (term,) = terms_of(cfg.reward, [echo_ids])[:1]
    assert (term.name, term.fn, term.weight) == ("short_answer", short_answer, 0.25)
    assert [t.name for t in terms_of(cfg.reward, [echo_ids])] == ["short_answer", "echo_ids"]
    with pytest.raises(ConfigError, match=r"reward.functions\[0\].fn='nocolon'"):
        load_config(None, ["reward.functions=[{fn: nocolon}]"])


def _validate(cfg, prompts, funcs=()):
    """run_grpo's check before any actor starts: the config's rules and the reward functions' in one error."""
    validate(cfg, "train", prompts=prompts, extra_problems=reward_function_problems(cfg.reward, prompts, funcs))


@pytest.mark.parametrize("spec, message", [
    ("shop_r1.not_a_module:f", "cannot load it (ModuleNotFoundError"),
    (f"{__name__}:missing", "cannot load it (AttributeError"),
    (f"{__name__}:NOT_CALLABLE", "int is not callable"),
    (f"{__name__}:one_too_few", "'one_too_few' returned 1 values for 2 completions"),
    (f"{__name__}:raises_on_stop", None),
])
def test_validate_refuses_a_broken_function_by_name_before_any_actor_starts(spec, message):
    cfg = load_config(None, [f"reward.functions=[{{fn: '{spec}'}}]"])
    prompts = [Prompt("ex0", (1,), CLICK), Prompt("ex1", (1,), Action("terminate"))]
    if message is None:  # the probe answers are the targets rendered as answers: this one raises on terminate
        with pytest.raises(ConfigError, match="'raises_on_stop' raised on a probe batch of 2 completions"):
            _validate(cfg, prompts)
        return
    with pytest.raises(ConfigError) as err:
        _validate(cfg, prompts)
    assert message in str(err.value) and spec.split(":")[1] in str(err.value)


def test_functions_given_in_code_are_checked_too_and_names_must_not_clash():
    cfg = load_config(None, [])
    with pytest.raises(ConfigError, match="'one_too_few' returned"):
        _validate(cfg, [Prompt("ex0", (1,), CLICK)] * 2, [one_too_few])
    with pytest.raises(ConfigError, match=r"reward functions \['echo_ids'\]: each needs its own metric name"):
        terms_of(cfg.reward, [echo_ids, echo_ids])
    _validate(cfg, [Prompt("ex0", (1,), CLICK)], [short_answer, echo_ids])
