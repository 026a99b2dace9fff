"""Numbers stay finite: the causes, the per-step metrics, the streak that stops a run, the weight check, and the
driver's skip of an update whose reward or advantage is NaN/inf (hand-built rollouts, a recording fake learner)."""

import math

import pytest
import torch

from shop_r1.algo import finite
from shop_r1.algo.advantages import group_advantages
from shop_r1.config import load_config
from shop_r1.types import Action, Completion, Generation, GRPOStepStats, Prompt, RewardBreakdown, ScoredGeneration


def test_driver_cause_names_the_first_non_finite_quantity():
    ok = torch.tensor([[1.0, 2.0]])
    assert finite.driver_cause(ok, ok) == ""
    assert finite.driver_cause(torch.tensor([[1.0, math.nan]]), ok) == "reward"
    assert finite.driver_cause(ok, torch.tensor([[math.inf, 0.0]])) == "advantage"
    assert finite.driver_cause(torch.tensor([[-math.inf, 0.0]]), torch.tensor([[math.nan]])) == "reward"
    assert finite.driver_cause(torch.zeros(0, 4), torch.zeros(0, 4)) == ""  # an empty batch is finite


def test_learner_cause_checks_losses_then_the_norm():
    assert finite.learner_cause([0.5, 1.0], 3.0) == ""
    assert finite.learner_cause([0.5, math.nan], 3.0) == "loss"
    assert finite.learner_cause([0.5], math.inf) == "grad_norm"
    assert finite.learner_cause([], None) == ""  # ZeRO: the norm is not measured before the step


def test_metrics_log_every_cause_each_step():
    assert finite.metrics("") == {"train/nonfinite_reward": 0.0, "train/nonfinite_advantage": 0.0,
                                  "train/nonfinite_loss": 0.0, "train/nonfinite_grad_norm": 0.0}
    assert finite.metrics("loss")["train/nonfinite_loss"] == 1.0
    assert sum(finite.metrics("grad_norm").values()) == 1.0
    with pytest.raises(ValueError, match="unknown non-finite cause 'oops'"):
        finite.metrics("oops")


def test_streak_stops_after_the_limit_in_a_row_and_resets_on_a_finite_step():
    streak = finite.NonFiniteStreak(limit=2)
    streak.observe(1, "loss")
    streak.observe(2, "")  # a finite step ends the streak
    streak.observe(3, "reward")
    with pytest.raises(finite.NonFiniteError) as err:
        streak.observe(4, "grad_norm")
    assert "2 update(s) in a row" in str(err.value)
    assert "step 3: reward, step 4: grad_norm" in str(err.value)
    assert "rl.max_nonfinite_steps=2" in str(err.value)


def test_weight_check_names_the_bad_parameters():
    named = [("a", torch.ones(2)), ("b", torch.tensor([math.nan])), ("c", torch.tensor([1.0, -math.inf]))]
    assert finite.nonfinite_names(named[:1]) == []
    assert finite.nonfinite_names(named) == ["b", "c"]
    finite.check_weights_finite([], "here", "step_000001")  # finite: nothing raised
    with pytest.raises(finite.NonFiniteError, match=r"here: non-finite weights in b, c; refusing to checkpoint them "
                                                   r"\(latest complete checkpoint: step_000001\)"):
        finite.check_weights_finite(["b", "c"], "here", "step_000001")
    with pytest.raises(finite.NonFiniteError, match=r"in p0, p1, p2, p3, p4 and 2 more;"):
        finite.check_weights_finite([f"p{i}" for i in range(7)], "here", None)


class RecordingLearners:
    world_size = 1

    def __init__(self):
        self.calls = 0

    def grpo_step(self, batch, rl):
        self.calls += 1
        return [GRPOStepStats(loss=0.1, kl=0.0, clip_fraction=0.0, ratio_mean=1.0, grad_norm=1.0, num_tokens=4,
                              step=self.calls)]


def _scored(totals):
    prompt = Prompt("e:0", (1, 2, 3), Action("terminate"))
    completions = tuple(Completion(token_ids=(5, 6), text="xy", logprobs=(-0.1, -0.2), topk_logprobs=((), ()),
                                   token_offsets=(0, 1), finish_reason="stop", policy_version=0) for _ in totals)
    rewards = tuple(RewardBreakdown(format=0.5, total=t, format_valid=True) for t in totals)
    return [ScoredGeneration(prompt, Generation(0, prompt.token_ids, completions, 32), rewards)]


@pytest.mark.parametrize("totals, cause", [((0.5, math.nan), "reward"), ((0.5, math.inf), "reward"),
                                           ((0.5, 1.5), "")])
def test_an_injected_nan_reward_skips_the_update_before_the_learner(totals, cause):
    from shop_r1.algo.batch import build_grpo_batch
    from shop_r1.train import SKIPPED, learner_update, step_advantages

    cfg = load_config(None, ["rollout.group_size=2", "rl.global_batch_size=2"])
    scored = _scored(totals)
    adv = step_advantages(scored, cfg)
    batch = build_grpo_batch(scored, adv.advantages, 0)
    learners = RecordingLearners()
    update = learner_update(learners, batch, scored, adv, cfg)
    assert update.nonfinite == cause
    assert learners.calls == (0 if cause else 1)  # a NaN reward never reaches the learner
    if cause:
        assert update.loss == SKIPPED.loss and update.num_tokens == 0


def test_nan_advantages_come_only_from_nan_rewards_here():
    # A NaN total makes the group's mean and std NaN: every advantage of the group is NaN, caught as "reward" first.
    adv = group_advantages(torch.tensor([[0.5, math.nan]], dtype=torch.float64))
    assert torch.isnan(adv.advantages).all()
