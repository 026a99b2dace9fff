"""A step's rewards as its advantages read them, and the one function that turns them into advantages.

    StepRewards [P][G] RewardBreakdown (+ each group's target type)
        -> totals_and_advantages    the one owner of both, on the driver and in the learner:
             with_self_certainty(s) every response's s(r) replaced, totals re-formed (shop_r1/reward/scorer.py)
             step_advantages        group advantages, scaled as rl.scale_rewards says (shop_r1/algo/advantages.py)
        -> kept_rows                the rows the update trains (rl.drop_zero_signal_groups leaves tied groups out;
                                    kept_rows_before_self_certainty: the same, before s(r), where s(r) cannot move it)

The driver calls these (shop_r1/train.py); so does the learner where s(r) comes from the update's own forward
(reward.self_certainty.source=update_logits: shop_r1/learner/grpo_step.py), on every rank, with the same inputs: the
advantages are the same numbers wherever they are computed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shop_r1.algo.advantages import GroupAdvantages, group_advantages
from shop_r1.algo.batch import GRPOBatch
from shop_r1.config import AdvantageConfig, RewardConfig
from shop_r1.reward.scorer import with_exact_self_certainty
from shop_r1.types import ACTION_TYPES, GRPOStepStats, RewardBreakdown, ScoredGeneration


@dataclass(frozen=True)
class StepRewards:
    """The step's rewards, one per response in batch order ([P][G]: group p's g-th sample is row p * G + g), and each
    group's target action type (an index into ACTION_TYPES; rl.scale_rewards=target_type's strata)."""

    rewards: tuple[tuple[RewardBreakdown, ...], ...]  # [P][G]
    target_types: tuple[int, ...]  # [P]

    @classmethod
    def of(cls, scored: Sequence[ScoredGeneration]) -> StepRewards:
        """The scored groups' rewards, without what the reward stage parsed (the advantages never read it)."""
        return cls(tuple(tuple(dataclasses.replace(r, parsed=None) for r in s.rewards) for s in scored),
                   tuple(ACTION_TYPES.index(s.prompt.target.type) for s in scored))

    @property
    def num_responses(self) -> int:
        return sum(len(group) for group in self.rewards)

    @property
    def group_size(self) -> int:
        return len(self.rewards[0]) if self.rewards else 0

    def with_self_certainty(self, certainty: Sequence[float], cfg: RewardConfig) -> StepRewards:
        """certainty[i] (one per response, in batch order) replaces the i-th response's s(r); totals re-formed."""
        if len(certainty) != self.num_responses:
            raise ValueError(f"{len(certainty)} self-certainty values for {self.num_responses} responses")
        out, start = [], 0
        for group in self.rewards:
            stop = start + len(group)
            out.append(tuple(with_exact_self_certainty(group, certainty[start:stop], cfg)))
            start = stop
        return StepRewards(tuple(out), self.target_types)

    def totals(self) -> torch.Tensor:
        """[P, G] float64."""
        return torch.tensor([[r.total for r in group] for group in self.rewards], dtype=torch.float64)

    def action_rewards(self) -> torch.Tensor:
        """[P, G] the total without alpha * s(r): format + action_type + attribute + value (+ the plug-in reward
        functions' weighted values, shop_r1/reward/functions.py), summed in one order for every sample so that equal
        terms give bit-equal sums (total - alpha * s would not)."""
        return torch.tensor([[r.format + r.action_type + r.attribute + r.value + r.plugin_total for r in group]
                             for group in self.rewards], dtype=torch.float64)

    def right_type(self) -> torch.Tensor:
        """[P, G] bool: the response's action type is the target's (it earned Table 1's action-type reward)."""
        return torch.tensor([[r.action_type > 0 for r in group] for group in self.rewards], dtype=torch.bool)

    def components(self, breaks_ties: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """rl.scale_rewards=decoupled's and within_type's components [2, P, G]: the decision (format + action_type)
        and the content (attribute + value + alpha * s, the rest of the total); and what must tie for each to carry no
        signal (the content without alpha * s unless self-certainty breaks ties)."""
        decision = [[r.format + r.action_type for r in group] for group in self.rewards]
        content = [[r.total - (r.format + r.action_type) for r in group] for group in self.rewards]
        content_tie = content if breaks_ties else [[r.attribute + r.value + r.plugin_total for r in group]
                                                   for group in self.rewards]
        return (torch.tensor([decision, content], dtype=torch.float64),
                torch.tensor([decision, content_tie], dtype=torch.float64))


def step_advantages(rewards: StepRewards, cfg: AdvantageConfig) -> GroupAdvantages:
    """Group advantages of the totals, scaled as rl.scale_rewards says; a group is zero-signal when its totals tie,
    or, with rl.self_certainty_breaks_ties=false, when its action rewards (the total without alpha * s) tie."""
    tie = None if cfg.self_certainty_breaks_ties else rewards.action_rewards()
    strata = components = tie_components = right_type = None
    if cfg.scale_rewards == "target_type":
        strata = torch.tensor(rewards.target_types)
    if cfg.scale_rewards in ("decoupled", "within_type"):
        components, tie_components = rewards.components(cfg.self_certainty_breaks_ties)
    if cfg.scale_rewards == "within_type":
        right_type = rewards.right_type()
    return group_advantages(rewards.totals(), scale=cfg.scale_rewards, tie_rewards=tie, strata=strata,
                            components=components, tie_components=tie_components, right_type=right_type)


@dataclass(frozen=True)
class StepAdvantages:
    """The step's rewards with their final totals (s(r) replaced where the learner gave it) and their advantages."""

    rewards: StepRewards
    advantages: GroupAdvantages


def totals_and_advantages(rewards: StepRewards, cfg: AdvantageConfig,
                          self_certainty: Sequence[float] | None = None) -> StepAdvantages:
    """The one owner of a step's totals and advantages, on the driver (shop_r1/train.py) and in the learner
    (shop_r1/learner/grpo_step.py, reward.self_certainty.source=update_logits) alike: each response's s(r) replaced by
    `self_certainty[i]` (batch order; None: the rewards' own s(r), engine top-k or none) with its total re-formed
    (shop_r1/reward/scorer.py: with_exact_self_certainty; the plug-in functions' part of the total unchanged), then
    `step_advantages` of those totals (scaling, tie rules, zero-signal groups)."""
    if self_certainty is not None:
        rewards = rewards.with_self_certainty(self_certainty, cfg.reward)
    return StepAdvantages(rewards, step_advantages(rewards, cfg))


def kept_rows(adv: GroupAdvantages, cfg: AdvantageConfig) -> list[int]:
    """The rows (batch order) the update trains: every row, or, with rl.drop_zero_signal_groups, those of the groups
    with signal (tied rewards: zero advantages, nothing to learn)."""
    num_prompts, group_size = adv.advantages.shape
    return [p * group_size + i for p in range(num_prompts)
            if not (cfg.drop_zero_signal_groups and adv.zero_signal[p]) for i in range(group_size)]


def kept_rows_before_self_certainty(rewards: StepRewards, cfg: AdvantageConfig) -> list[int] | None:
    """`kept_rows` when s(r) cannot move them, so known before any forward: with rl.self_certainty_breaks_ties=false a
    group is zero-signal when its action rewards tie (`step_advantages`; under rl.scale_rewards=decoupled too: its
    components' ties only shape the advantages), whatever any s(r) is. None when s(r) breaks ties (the totals decide).
    """
    if cfg.self_certainty_breaks_ties:
        return None
    return kept_rows(step_advantages(rewards, cfg), cfg)


@dataclass(frozen=True)
class UpdateWithSelfCertainty:
    """What the update that computed s(r) from its own forward returns (reward.self_certainty.source=update_logits):
    the step's figures, every response's exact s(r) (batch order) and the advantages of the re-formed totals."""

    stats: GRPOStepStats
    self_certainty: list[float]  # [B]
    advantages: GroupAdvantages
    updated: bool
    """Whether the update ran (an optimizer step was taken or skipped by the learner's own finite check); False when
    there was nothing to train (every group dropped) or a reward or advantage was NaN/inf (`stats.nonfinite` says
    which): the driver reports those steps as it does when it never calls the learner (train.SKIPPED)."""


def update_rows(batch: GRPOBatch, adv: GroupAdvantages, adv_cfg: AdvantageConfig, action_only: bool) -> GRPOBatch:
    """The batch the update trains: every response with its advantage, minus the groups without signal when
    rl.drop_zero_signal_groups (`kept_rows`); with rl.loss_tokens=action (`action_only`) only the completion tokens
    outside the rationale train. The driver's (train.update_batch) and the learner's one-call update's alike
    (shop_r1/learner/grpo_step.py: grpo_update_after_self_certainty)."""
    batch = batch.with_advantages(adv.advantages)
    if action_only:
        batch = batch.outside_rationale()
    if not adv_cfg.drop_zero_signal_groups:
        return batch
    return batch.select(kept_rows(adv, adv_cfg))

