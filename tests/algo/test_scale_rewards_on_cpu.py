"""rl.scale_rewards (group / batch / none / target_type / decoupled / within_type) and
rl.self_certainty_breaks_ties, worked out by hand."""

import math

import pytest
import torch

from shop_r1.algo.advantages import group_advantages
from shop_r1.config import Config
from shop_r1.train import step_advantages
from shop_r1.types import Action, Generation, Prompt, RewardBreakdown, ScoredGeneration

# Two groups of two: [0, 4] (mean 2) and [0, 6] (mean 3); centred: (-2, 2) and (-3, 3).
REWARDS = torch.tensor([[0.0, 4.0], [0.0, 6.0]])


def test_group_scaling_divides_by_each_groups_std():
    # group std (unbiased): sqrt((2^2 + 2^2) / 1) = 2 sqrt 2 and 3 sqrt 2 -> (-1/sqrt 2, 1/sqrt 2) for both groups
    out = group_advantages(REWARDS, eps=0.0, scale="group")
    h = 1 / math.sqrt(2)
    torch.testing.assert_close(out.advantages, torch.tensor([[-h, h], [-h, h]], dtype=torch.float64))
    assert out.num_zero_signal_groups == 0


def test_group_is_the_default():
    torch.testing.assert_close(group_advantages(REWARDS).advantages,
                               group_advantages(REWARDS, scale="group").advantages)


def test_batch_scaling_divides_by_the_std_of_the_whole_batch():
    # all rewards [0, 4, 0, 6]: mean 2.5, deviations (-2.5, 1.5, -2.5, 3.5), squares 6.25 + 2.25 + 6.25 + 12.25 = 27,
    # unbiased variance 27 / 3 = 9 -> std 3; advantages = centred / 3 = (-2/3, 2/3), (-1, 1)
    out = group_advantages(REWARDS, eps=0.0, scale="batch")
    torch.testing.assert_close(out.advantages, torch.tensor([[-2 / 3, 2 / 3], [-1.0, 1.0]], dtype=torch.float64))


def test_batch_std_counts_the_tied_groups_too():
    # [0, 1], [0, 5], [3, 3]: all six have mean 2, deviations (-2, -1, -2, 3, 1, 1), squares sum 20, variance
    # 20 / 5 = 4 -> std 2 (without the tied group it would be sqrt(17/3)); centred (-0.5, 0.5), (-2.5, 2.5), tied -> 0
    out = group_advantages(torch.tensor([[0.0, 1.0], [0.0, 5.0], [3.0, 3.0]]), eps=0.0, scale="batch")
    torch.testing.assert_close(out.advantages,
                               torch.tensor([[-0.25, 0.25], [-1.25, 1.25], [0.0, 0.0]], dtype=torch.float64))
    assert out.zero_signal.tolist() == [False, False, True]


def test_none_only_subtracts_the_group_mean():
    # Dr. GRPO: the centred rewards themselves, in reward units
    out = group_advantages(REWARDS, scale="none")
    torch.testing.assert_close(out.advantages, torch.tensor([[-2.0, 2.0], [-3.0, 3.0]], dtype=torch.float64))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_every_scale_zeroes_tied_groups_and_single_samples(scale):
    out = group_advantages(torch.tensor([[1001.0, 1001.0, 1001.0], [0.8, 0.8, 1.8]]), scale=scale)
    assert out.advantages[0].tolist() == [0.0, 0.0, 0.0]
    assert out.zero_signal.tolist() == [True, False]
    single = group_advantages(torch.tensor([[3.0], [7.0]]), scale=scale)
    assert single.advantages.tolist() == [[0.0], [0.0]] and single.num_zero_signal_groups == 2


def test_unknown_scale_and_mismatched_tie_rewards_are_errors():
    with pytest.raises(ValueError, match="scale must be one of"):
        group_advantages(REWARDS, scale="token")
    with pytest.raises(ValueError, match="tie_rewards has shape"):
        group_advantages(REWARDS, tie_rewards=torch.zeros(2, 3))


# ------------------------------------------------------------------------------------- ties: self-certainty or not

ALPHA = 0.005


def _reward(action_part: tuple[float, float, float, float], s: float) -> RewardBreakdown:
    fmt, action_type, attribute, value = action_part
    return RewardBreakdown(format=fmt, action_type=action_type, attribute=attribute, value=value, self_certainty=s,
                           total=fmt + action_type + attribute + value + ALPHA * s, format_valid=True)


def _group(rewards: list[RewardBreakdown]) -> ScoredGeneration:
    return ScoredGeneration(Prompt("ex", (1, 2), Action("terminate")), Generation(0, (1, 2), (), 100), tuple(rewards))


TERMINATE = (0.5, 0.3, 0.0, 0.0)  # a right terminate: 0.8
# Group 0: three right terminates, s = 6.4, 6.8, 7.2 -> totals 0.832, 0.834, 0.836: only alpha * s differs.
TIED = _group([_reward(TERMINATE, 6.4), _reward(TERMINATE, 6.8), _reward(TERMINATE, 7.2)])
# Group 1: action rewards 0.8, 0.5 (wrong type) and 1001 (exact click), each with s = 7.
MIXED = _group([_reward(TERMINATE, 7.0), _reward((0.5, 0.0, 0.0, 0.0), 7.0), _reward((0.5, 0.3, 0.2, 1000.0), 7.0)])


def _cfg(breaks_ties: bool) -> Config:
    cfg = Config()
    cfg.rl.self_certainty_breaks_ties = breaks_ties
    return cfg


def test_self_certainty_breaks_ties_by_default():
    # The paper: totals (0.832, 0.834, 0.836) differ -> centred (-0.002, 0, 0.002), std 0.002 -> about (-1, 0, 1)
    # (eps = 1e-6 next to 0.002 makes it 0.9995): confident rationales pushed up by a full unit.
    assert Config().rl.self_certainty_breaks_ties is True
    adv = step_advantages([TIED, MIXED], Config())
    assert adv.zero_signal.tolist() == [False, False] and adv.num_zero_signal_groups == 0
    torch.testing.assert_close(adv.advantages[0], torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64), atol=1e-3,
                               rtol=0)


def test_tied_action_rewards_are_zero_signal_when_self_certainty_does_not_break_ties():
    adv = step_advantages([TIED, MIXED], _cfg(breaks_ties=False))
    assert adv.zero_signal.tolist() == [True, False]
    assert adv.num_zero_signal_groups == 1  # what train/zero_signal_groups logs
    assert adv.advantages[0].tolist() == [0.0, 0.0, 0.0]
    # Group 1 still uses the totals (0.835, 0.535, 1001.035): the same advantages either way.
    torch.testing.assert_close(adv.advantages[1], step_advantages([TIED, MIXED], Config()).advantages[1])


def test_action_part_ties_are_exact_whatever_self_certainty_adds():
    # total - alpha * s would differ from the action part by float rounding; the sum of the terms does not.
    group = _group([_reward((0.5, 0.3, 0.2, 1000 * 0.8), s) for s in (0.1, 3.3, 6.9, 7.123456789)])
    assert step_advantages([group], _cfg(breaks_ties=False)).zero_signal.tolist() == [True]
    assert step_advantages([group], Config()).zero_signal.tolist() == [False]


def test_scale_rewards_setting_reaches_the_advantages():
    cfg = Config()
    cfg.rl.scale_rewards = "none"
    adv = step_advantages([MIXED], cfg)
    # totals 0.835, 0.535, 1001.035: mean 334.135 -> centred (-333.3, -333.6, 666.9)
    torch.testing.assert_close(adv.advantages[0], torch.tensor([-333.3, -333.6, 666.9], dtype=torch.float64),
                               atol=1e-9, rtol=0)


# ------------------------------------------------------------------------------ target_type: batch std per stratum

def test_target_type_scaling_divides_by_each_strata_std():
    # strata: groups 0 and 2 share label 0, group 1 is label 1 alone.
    # label 0: rewards [0, 4] and [0, 2]: mean 1.5, deviations (-1.5, 2.5, -1.5, 0.5), squares 2.25 + 6.25 + 2.25 +
    # 0.25 = 11, unbiased variance 11 / 3 -> std sqrt(11/3); centred (-2, 2) and (-1, 1).
    # label 1: [0, 6] alone: std 3 sqrt 2 (the group's own), centred (-3, 3) -> (-1/sqrt 2, 1/sqrt 2).
    rewards = torch.tensor([[0.0, 4.0], [0.0, 6.0], [0.0, 2.0]])
    out = group_advantages(rewards, eps=0.0, scale="target_type", strata=torch.tensor([0, 1, 0]))
    s0, h = math.sqrt(11 / 3), 1 / math.sqrt(2)
    torch.testing.assert_close(out.advantages, torch.tensor([[-2 / s0, 2 / s0], [-h, h], [-1 / s0, 1 / s0]],
                                                            dtype=torch.float64))


def test_target_type_with_one_stratum_is_batch_scaling():
    rewards = torch.tensor([[0.0, 4.0], [0.0, 6.0], [1.0, 1.5]])
    torch.testing.assert_close(
        group_advantages(rewards, scale="target_type", strata=torch.tensor([2, 2, 2])).advantages,
        group_advantages(rewards, scale="batch").advantages)


def test_target_type_needs_strata_of_one_label_per_group():
    with pytest.raises(ValueError, match="needs strata"):
        group_advantages(REWARDS, scale="target_type")
    with pytest.raises(ValueError, match="needs strata"):
        group_advantages(REWARDS, scale="target_type", strata=torch.tensor([0, 1, 2]))


def test_target_type_gives_terminate_groups_a_voice_beside_dars_successes():
    # MIXED's target is terminate in _group; a click group with an exact hit sits beside it. With one batch std the
    # terminate group's 0.3 difference is ~1e-3 of the std; per stratum it is a unit-scale advantage.
    click = ScoredGeneration(Prompt("c", (1, 2), Action("click", "buy_now")), Generation(0, (1, 2), (), 100),
                             (_reward((0.5, 0.3, 0.2, 1000.0), 7.0), _reward((0.5, 0.0, 0.0, 0.0), 7.0)))
    term = _group([_reward(TERMINATE, 7.0), _reward((0.5, 0.0, 0.0, 0.0), 7.0)])
    cfg = _cfg(breaks_ties=False)
    cfg.rl.scale_rewards = "batch"
    batch = step_advantages([click, term], cfg).advantages
    cfg.rl.scale_rewards = "target_type"
    strat = step_advantages([click, term], cfg).advantages
    assert abs(float(batch[1, 0])) < 1e-3
    # terminate stratum alone: totals 0.835, 0.535 -> centred (0.15, -0.15), std 0.3 / sqrt 2 -> (1/sqrt 2, -1/sqrt 2)
    torch.testing.assert_close(strat[1], torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2)], dtype=torch.float64),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(strat[0], torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2)], dtype=torch.float64),
                               atol=1e-5, rtol=0)


# ------------------------------------------------------------------ decoupled: GDPO, each component its own group std

def test_decoupled_keeps_the_right_type_above_the_wrong_one_beside_a_dars_success():
    # One group: A right type, no text (decision 0.8, content 0); B right type and text (0.8, 1000); C terminate
    # (0.5, 0)
    # decision (0.8, 0.8, 0.5): mean 0.7, centred (0.1, 0.1, -0.2), std sqrt(0.06 / 2) = sqrt 0.03 -> (1, 1, -2)/sqrt 3
    # content (0, 1000, 0): mean 1000/3, centred (-1, 2, -1) * 1000/3, std 1000/sqrt 3 -> (-1, 2, -1)/sqrt 3
    # sum (0, 3, -3)/sqrt 3 = (0, sqrt 3, -sqrt 3); batch std sqrt((3 + 3) / 2) = sqrt 3 -> (0, 1, -1)
    comps = torch.tensor([[[0.8, 0.8, 0.5]], [[0.0, 1000.0, 0.0]]])
    out = group_advantages(comps.sum(dim=0), eps=0.0, scale="decoupled", components=comps)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.0, 1.0, -1.0]], dtype=torch.float64))
    # One std for the sum (group scaling) puts A with C: totals (0.8, 1000.8, 0.5) -> A and C both about -1/sqrt 3
    grouped = group_advantages(comps.sum(dim=0), eps=0.0, scale="group").advantages
    assert abs(float(grouped[0, 0] - grouped[0, 2])) < 1e-3


def test_decoupled_zeroes_a_component_tied_in_its_group_and_scales_by_the_batch():
    # Group 0: decision (1, 0), content tied (2, 2) -> (1/sqrt 2, -1/sqrt 2) + 0.
    # Group 1: decision tied (0, 0), content (0, 10) -> 0 + (-1/sqrt 2, 1/sqrt 2): a 10-point gap weighs as a 1-point.
    # sum +-1/sqrt 2 four times: mean 0, unbiased variance (4 * 0.5) / 3 -> std sqrt(2/3);
    # 1/sqrt 2 / sqrt(2/3) = sqrt 3/2
    comps = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[2.0, 2.0], [0.0, 10.0]]])
    out = group_advantages(comps.sum(dim=0), eps=0.0, scale="decoupled", components=comps)
    c = math.sqrt(3) / 2
    torch.testing.assert_close(out.advantages, torch.tensor([[c, -c], [-c, c]], dtype=torch.float64))


def test_decoupled_needs_components_of_the_rewards_shape():
    with pytest.raises(ValueError, match="needs components"):
        group_advantages(REWARDS, scale="decoupled")
    with pytest.raises(ValueError, match="needs components"):
        group_advantages(REWARDS, scale="decoupled", components=torch.zeros(2, 3, 2))


# ------------------------------------------------------------------ within_type: content compared within the right type

def test_within_type_pays_the_type_alike_and_compares_content_only_among_the_right_type():
    # Group 0 (a click target): a terminate (decision 0.5, content 0), a wrong-name click (0.8, 0.2), the exact click
    # (0.8, 1000.2), another wrong-name click (0.8, 0.2). Group 1 (a query target): a click (0.5, 0), two queries at
    # ROUGE 0.8 (0.8, 800.3) and a query far off (0.8, 0.3).
    # decision: group 0 (0.5, .8, .8, .8) and group 1 (0.5, .8, .8, .8): centred (-0.225, 0.075 x3) in both; batch
    # std over the 8 decisions: mean 0.725, squared deviations 2 * 0.225^2 + 6 * 0.075^2 = 0.135, / 7 ->
    # std sqrt(0.0192857) = 0.138873.
    # content among the right type: group 0 (0.2, 1000.2, 0.2) mean 333.5333 -> (-333.33, +666.67, -333.33);
    # group 1 (800.3, 800.3, 0.3) mean 533.6333 -> (+266.67, +266.67, -533.33); RMS over the 6:
    # (2 * 333.33^2 + 666.67^2 + 2 * 266.67^2 + 533.33^2) / 6 = (222222 + 444444 + 142222 + 284444) / 6 = 182222
    # -> 426.875. The wrong type's content term is 0.
    d = torch.tensor([[0.5, 0.8, 0.8, 0.8], [0.5, 0.8, 0.8, 0.8]], dtype=torch.float64)
    c = torch.tensor([[0.0, 0.2, 1000.2, 0.2], [0.0, 800.3, 800.3, 0.3]], dtype=torch.float64)
    out = group_advantages(d + c, eps=0.0, scale="within_type", components=torch.stack([d, c]), right_type=d > 0.6)
    dstd, rms = math.sqrt(0.135 / 7), math.sqrt((2 * (1000 / 3) ** 2 + (2000 / 3) ** 2 + 2 * (800 / 3) ** 2
                                                   + (1600 / 3) ** 2) / 6)
    assert rms == pytest.approx(426.875, abs=1e-3)
    expected = torch.tensor([[-0.225 / dstd, 0.075 / dstd - 1000 / 3 / rms, 0.075 / dstd + 2000 / 3 / rms,
                              0.075 / dstd - 1000 / 3 / rms],
                             [-0.225 / dstd, 0.075 / dstd + 800 / 3 / rms, 0.075 / dstd + 800 / 3 / rms,
                              0.075 / dstd - 1600 / 3 / rms]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected)
    # The wrong-type answer's advantage is the same in both groups, though the query group's right type earns more
    # on average (~534 vs ~334): the type prior is not pulled toward the type whose near-misses pay.
    assert float(out.advantages[0, 0]) == pytest.approx(float(out.advantages[1, 0]))
    # `batch` scaling puts group 1's click below group 0's terminate by the gap of the group means (400.95 - 250.875)
    totals = d + c
    batch = group_advantages(totals, eps=0.0, scale="batch").advantages
    assert float(batch[1, 0] - batch[0, 0]) == pytest.approx(-150.075 / float(totals.std()))


def test_within_type_gives_a_lone_right_type_answer_only_its_decision_term():
    d = torch.tensor([[0.8, 0.5, 0.5]], dtype=torch.float64)
    c = torch.tensor([[1000.2, 0.0, 0.0]], dtype=torch.float64)
    out = group_advantages(d + c, eps=0.0, scale="within_type", components=torch.stack([d, c]), right_type=d > 0.6)
    # decision (0.8, 0.5, 0.5): centred (0.2, -0.1, -0.1), std sqrt(0.06 / 2) = sqrt 0.03; content: nothing to compare
    r = math.sqrt(0.03)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.2 / r, -0.1 / r, -0.1 / r]], dtype=torch.float64))


def test_within_type_leaves_a_lone_right_type_answer_out_of_the_content_rms():
    # Group 0: one right-type answer (content 1000) beside two wrong-type ones; group 1: right-type answers with
    # content (0, 30, 60), centred (-30, 0, 30). The RMS is over group 1's three only: sqrt(1800 / 3) = sqrt 600 (with
    # group 0's lone answer counted as a centred 0 it would be sqrt(1800 / 4)).
    d = torch.tensor([[0.8, 0.5, 0.5], [0.8, 0.8, 0.8]], dtype=torch.float64)
    c = torch.tensor([[1000.0, 0.0, 0.0], [0.0, 30.0, 60.0]], dtype=torch.float64)
    out = group_advantages(d + c, eps=0.0, scale="within_type", components=torch.stack([d, c]), right_type=d > 0.6)
    # decision batch std: values (0.8, 0.5, 0.5, 0.8, 0.8, 0.8), mean 0.7, (4 * 0.01 + 2 * 0.04) / 5 = 0.024
    dstd = math.sqrt(0.024)
    rms = math.sqrt(600.0)
    expected = torch.tensor([[0.2 / dstd, -0.1 / dstd, -0.1 / dstd], [-30 / rms, 0.0, 30 / rms]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected)


def test_within_type_needs_components_and_a_right_type_mask():
    comps = torch.zeros(2, *REWARDS.shape)
    with pytest.raises(ValueError, match="needs components"):
        group_advantages(REWARDS, scale="within_type", right_type=torch.ones(REWARDS.shape, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool right_type"):
        group_advantages(REWARDS, scale="within_type", components=comps)
    with pytest.raises(ValueError, match="bool right_type"):
        group_advantages(REWARDS, scale="within_type", components=comps, right_type=torch.ones(REWARDS.shape))


def test_step_advantages_within_type_reads_the_right_type_from_the_action_type_reward():
    # MIXED: decision (0.8, 0.5, 0.8), right type (yes, no, yes); content (7a, -, 1000.2 + 7a) with 7a = 0.035: among
    # the right type centred (-500.1, +500.1). TIED: decisions 0.8 x3, content (6.4a, 6.8a, 7.2a) centred
    # (-0.002, 0, +0.002), and zero-signal (its action rewards tie), so 0 in the end.
    # decision batch std over six: mean 0.75, (5 * 0.05^2 + 0.25^2) / 5 = 0.015; MIXED centred (0.1, -0.2, 0.1).
    # content RMS over the five compared answers: sqrt((2 * 0.002^2 + 2 * 500.1^2) / 5).
    cfg = _cfg(breaks_ties=False)
    cfg.rl.scale_rewards = "within_type"
    out = step_advantages([TIED, MIXED], cfg)
    dstd, rms = math.sqrt(0.015), math.sqrt((2 * 0.002 ** 2 + 2 * 500.1 ** 2) / 5)
    mixed = [0.1 / dstd - 500.1 / rms, -0.2 / dstd, 0.1 / dstd + 500.1 / rms]
    torch.testing.assert_close(out.advantages, torch.tensor([[0.0, 0.0, 0.0], mixed], dtype=torch.float64),
                               atol=1e-4, rtol=0)
    assert out.num_zero_signal_groups == 1
    # The wrong type sits below the right terminate only by the decision; the exact click above both.
    assert mixed[1] < mixed[0] < mixed[2]


@pytest.mark.parametrize("breaks_ties", [False, True])
def test_step_advantages_decoupled_splits_decision_from_content(breaks_ties):
    # MIXED: decision (0.8, 0.5, 0.8) -> (1, -2, 1)/sqrt 3; content (7a, 7a, 1000.2 + 7a) -> (-1, -1, 2)/sqrt 3;
    # sum (0, -sqrt 3, sqrt 3). TIED: decision tied -> 0; content (6.4a, 6.8a, 7.2a) ties in its action part, so it is
    # 0 unless self-certainty breaks ties, then (-1, 0, 1). Batch std over six values, unbiased:
    # 6 / 5 -> sqrt 1.2 without the tie-break, (6 + 2) / 5 -> sqrt 1.6 with it.
    cfg = _cfg(breaks_ties=breaks_ties)
    cfg.rl.scale_rewards = "decoupled"
    out = step_advantages([TIED, MIXED], cfg)
    std = math.sqrt(1.6 if breaks_ties else 1.2)
    r3 = math.sqrt(3)
    tied = [-1 / std, 0.0, 1 / std] if breaks_ties else [0.0, 0.0, 0.0]
    # atol: step_advantages keeps eps = 1e-6, against TIED's content std of alpha * 0.4 = 0.002
    torch.testing.assert_close(out.advantages, torch.tensor([tied, [0.0, -r3 / std, r3 / std]], dtype=torch.float64),
                               atol=1e-3, rtol=0)
    assert out.num_zero_signal_groups == (0 if breaks_ties else 1)
