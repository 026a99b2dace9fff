"""kept_rows_before_self_certainty: with rl.self_certainty_breaks_ties=false the rows the update trains are known
before any s(r) (reward.self_certainty.source=update_logits forwards the others without gradient)."""

import pytest
import torch

from shop_r1.algo.step_rewards import StepRewards, kept_rows, kept_rows_before_self_certainty, step_advantages
from shop_r1.config import RewardConfig, RLConfig
from shop_r1.types import RewardBreakdown

# Action rewards from a small set, so that many groups tie; the sampled s(r) differs in every row.
TERMS = [(0.0, 0.0, 0.0, 0.0), (0.5, 0.3, 0.0, 0.0), (0.5, 0.3, 0.2, 1000.0), (0.5, 0.0, 0.0, 0.0)]


def _rewards(seed: int, num_prompts: int = 6, group_size: int = 3) -> StepRewards:
    g = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(num_prompts):
        group = []
        for _ in range(group_size):
            f, a, att, v = TERMS[int(torch.randint(0, len(TERMS), (1,), generator=g))]
            group.append(RewardBreakdown(format=f, action_type=a, attribute=att, value=v, total=f + a + att + v,
                                         format_valid=f > 0))
        groups.append(tuple(group))
    return StepRewards(tuple(groups), tuple(int(t) for t in torch.randint(0, 3, (num_prompts,), generator=g)))


@pytest.mark.parametrize("scale", ["group", "batch", "none", "target_type", "decoupled", "within_type"])
def test_the_kept_rows_known_before_s_are_those_after_it(scale):
    cfg = RLConfig(drop_zero_signal_groups=True, self_certainty_breaks_ties=False,
                   scale_rewards=scale).advantage_config(RewardConfig())
    dropped = 0
    for seed in range(20):
        rewards = _rewards(seed)
        known = kept_rows_before_self_certainty(rewards, cfg)
        s = torch.rand(rewards.num_responses, generator=torch.Generator().manual_seed(seed)).tolist()
        assert known == kept_rows(step_advantages(rewards.with_self_certainty(s, cfg.reward), cfg), cfg)
        dropped += rewards.num_responses - len(known)
    assert dropped > 0  # the draws hold tied groups


def test_none_where_s_breaks_ties():
    cfg = RLConfig(drop_zero_signal_groups=True).advantage_config(RewardConfig())
    assert cfg.self_certainty_breaks_ties and kept_rows_before_self_certainty(_rewards(0), cfg) is None


def test_one_owner_re_forms_the_totals_and_gives_their_advantages():
    """totals_and_advantages: s(r) = (2, 4) replaces (0, 0) with alpha = 0.005, so totals 1.0 -> 1.01 and 1.02; a
    plug-in function's 0.5 in the second total stays. Group advantages of (1.01, 1.52): centred -/+ 0.255, std
    0.51 / sqrt(2) = 0.360624 -> -/+ 0.707105 (eps 1e-6)."""
    from shop_r1.algo.step_rewards import totals_and_advantages
    from shop_r1.config import load_config
    from shop_r1.types import RewardBreakdown, TermValue

    cfg = load_config(None, [])
    a = RewardBreakdown(format=0.5, action_type=0.3, attribute=0.2, total=1.0, format_valid=True)
    b = RewardBreakdown(format=0.5, action_type=0.3, attribute=0.2, total=1.5, format_valid=True,
                        terms=(TermValue("bonus", 1.0, 0.5),))
    owned = totals_and_advantages(StepRewards(((a, b),), (0,)), cfg.rl.advantage_config(cfg.reward), [2.0, 4.0])
    assert [r.total for r in owned.rewards.rewards[0]] == pytest.approx([1.01, 1.52])
    assert [r.self_certainty for r in owned.rewards.rewards[0]] == [2.0, 4.0]
    assert owned.advantages.advantages[0].tolist() == pytest.approx([-0.707105, 0.707105], abs=1e-6)
    unchanged = totals_and_advantages(StepRewards(((a, b),), (0,)), cfg.rl.advantage_config(cfg.reward))
    assert [r.total for r in unchanged.rewards.rewards[0]] == [1.0, 1.5]
