"""Group-relative advantages (GRPO, paper Eq. 4 optimised with Shao et al.'s estimator), and their scaling.

    A_i = (r_i - mean(r_group)) / scale          scale (`rl.scale_rewards`):
        group   std(r_group) + eps               GRPO as the paper, TRL and verl compute it (the default)
        batch   std(all rewards of the step) + eps
        none    1                                Dr. GRPO (Liu et al. 2025): no std, advantages in reward units
        target_type  std(rewards of the step's groups whose target has this group's action type) + eps
                                                 batch std within each stratum of target type (click,
                                                 type_and_submit, terminate): a departure from the paper, see
                                                 `rl.scale_rewards`
        decoupled    GDPO (Liu et al. 2026, arXiv 2601.05242): each reward component is centred and divided by its
                     own group std (0 where the component ties within the group), the per-component advantages are
                     summed, and the sum is divided by its std over the whole batch

`decoupled` exists for the same reason, from the other side: with one scale for the summed reward, a group in
which one sample hits a query (DARS ~1000) gives its other type_and_submit samples the same negative advantage as its
`terminate` samples, so the right *type* earns nothing beside the rare right *text*. Normalised apart, the action-type
term keeps its own unit-scale signal in every group where the types differ, and the DARS term its own.

`target_type` exists because Table 1 pays a correct `terminate` 0.3 while a correct click or query pays up to DARS
(1000): one batch std then leaves terminate groups with advantages ~1e-3 (no signal at all), while their terminate
samples are still pushed down wherever a sibling in a click/type group succeeds, and the policy stops terminating.
Per-stratum scaling gives each target type's groups unit-scale advantages, like `batch` does for the DARS-scale types.

`within_type` exists because a reward's content term also moves the type prior: Table 1 pays a query within ROUGE-L
0.75 of the target most of DARS while a click earns only its exact name (with reward.click_guard), so the right type
earns ~900 on query targets and ~400 on click targets on average, and a policy that cannot always tell the two apart
learns to type (issue 21: 32 -> 59 % typed answers, 29 % of targets). Here the type decision is paid the same
whichever type is right, and the name or text only competes with the group's other answers of the right type.

std is unbiased (n-1), as TRL and verl compute it. Computed in float64: at DARS-scale totals (~1000) float32's spacing
(6e-5) is coarser than the differences the self-certainty term makes (alpha * s ~ 1e-3 .. 1e-5), which float32 would
round away.

A group of one sample, or one whose rewards all tie, carries no relative signal: its advantages are 0 (it is
reported as a zero-signal group and can be dropped from the update). Which rewards must tie is the caller's choice
(`tie_rewards`): the totals (the paper: self-certainty breaks ties), or the action part alone, so that alpha * s(r)
cannot by itself decide the advantages of a group whose samples all earned the same action reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

ScaleRewards = Literal["group", "batch", "none", "target_type", "decoupled", "within_type"]
SCALE_REWARDS: tuple[str, ...] = ("group", "batch", "none", "target_type", "decoupled", "within_type")


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: torch.Tensor  # [P, G] float64
    zero_signal: torch.Tensor  # [P] bool: the group's tie rewards all equal (or G == 1)

    @property
    def num_zero_signal_groups(self) -> int:
        return int(self.zero_signal.sum())


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale: ScaleRewards = "group",
                     tie_rewards: torch.Tensor | None = None,
                     strata: torch.Tensor | None = None, components: torch.Tensor | None = None,
                     tie_components: torch.Tensor | None = None,
                     right_type: torch.Tensor | None = None) -> GroupAdvantages:
    """rewards [P, G] (total reward of each sample) -> advantages [P, G].

    `tie_rewards` [P, G] (default: `rewards`): a group whose tie rewards are all equal is zero-signal. `batch`
    scales by the std of every reward in `rewards`, zero-signal groups included (they are part of the step's batch).
    `strata` [P] (integer label per group, needed by `target_type` only): `target_type` scales each group by the std
    of every reward of the groups sharing its label (a stratum of one group uses that group's std).
    `components` [K, P, G] (needed by `decoupled` only): the reward's terms, summing to `rewards`; component k is
    normalised within a group only where `tie_components[k]` (default: `components[k]`) does not tie there.
    `within_type` needs `components` [2, P, G] (decision, content) and `right_type` [P, G] bool (the sample's action
    type is the target's).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, G], got shape {tuple(rewards.shape)}")
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale must be one of {SCALE_REWARDS}, got {scale!r}")
    tie = rewards if tie_rewards is None else tie_rewards
    if tie.shape != rewards.shape:
        raise ValueError(f"tie_rewards has shape {tuple(tie.shape)}, rewards {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float64)
    num_prompts, group_size = rewards.shape
    if group_size == 1:
        return GroupAdvantages(torch.zeros_like(rewards), torch.ones(num_prompts, dtype=torch.bool))
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "group":
        adv = centred / (rewards.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        adv = centred / (rewards.std() + eps)
    elif scale == "target_type":
        if strata is None or strata.shape != (num_prompts,):
            raise ValueError(f"scale='target_type' needs strata of shape ({num_prompts},), got "
                             f"{None if strata is None else tuple(strata.shape)}")
        std = torch.empty(num_prompts, 1, dtype=torch.float64)
        for label in strata.unique():
            rows = strata == label
            std[rows] = rewards[rows].std()
        adv = centred / (std + eps)
    elif scale == "decoupled":
        adv = _decoupled(rewards, components, tie_components, eps)
    elif scale == "within_type":
        adv = _within_type(rewards, components, right_type, eps)
    else:
        adv = centred
    zero_signal = (tie == tie[:, :1]).all(dim=1)
    adv = torch.where(zero_signal.unsqueeze(1), torch.zeros_like(adv), adv)
    return GroupAdvantages(adv, zero_signal)


def _decoupled(rewards: torch.Tensor, components: torch.Tensor | None, tie_components: torch.Tensor | None,
               eps: float) -> torch.Tensor:
    """GDPO: sum_k (c_k - group mean) / (group std + eps), 0 for a component tied in its group; then / (batch std of
    the sum + eps)."""
    if components is None or components.dim() != 3 or components.shape[1:] != rewards.shape:
        raise ValueError(f"scale='decoupled' needs components of shape (K, {', '.join(map(str, rewards.shape))}), "
                         f"got {None if components is None else tuple(components.shape)}")
    comps = components.to(torch.float64)
    tie = comps if tie_components is None else tie_components
    if tie.shape != comps.shape:
        raise ValueError(f"tie_components has shape {tuple(tie.shape)}, components {tuple(comps.shape)}")
    per = (comps - comps.mean(dim=2, keepdim=True)) / (comps.std(dim=2, keepdim=True) + eps)
    tied = (tie == tie[:, :, :1]).all(dim=2, keepdim=True)  # [K, P, 1]
    summed = torch.where(tied, torch.zeros_like(per), per).sum(dim=0)  # [P, G]
    return summed / (summed.std() + eps)


def _within_type(rewards: torch.Tensor, components: torch.Tensor | None, right_type: torch.Tensor | None,
                 eps: float) -> torch.Tensor:
    """(d - group mean of d) / (batch std of d + eps) + (c - mean of c over the group's right-type samples) / (batch
    RMS of those centred c + eps) on right-type samples, d and c = components[0], components[1]; a right-type sample
    alone in its group gets no content term (nothing of its type to compare with)."""
    if components is None or components.dim() != 3 or components.shape[0] != 2 or components.shape[1:] != rewards.shape:
        raise ValueError(f"scale='within_type' needs components of shape (2, {', '.join(map(str, rewards.shape))}), "
                         f"got {None if components is None else tuple(components.shape)}")
    if right_type is None or right_type.shape != rewards.shape or right_type.dtype != torch.bool:
        raise ValueError(f"scale='within_type' needs a bool right_type of shape {tuple(rewards.shape)}, got "
                         f"{None if right_type is None else (tuple(right_type.shape), right_type.dtype)}")
    decision, content = components.to(torch.float64)
    decision_adv = _scaled(decision - decision.mean(dim=1, keepdim=True), decision.std(), eps)
    weight = right_type.to(torch.float64)
    count = weight.sum(dim=1, keepdim=True)
    mean = (content * weight).sum(dim=1, keepdim=True) / count.clamp(min=1)
    compared = right_type & (count >= 2)
    centred = torch.where(compared, content - mean, torch.zeros_like(content))
    rms = (centred.pow(2).sum() / compared.sum().clamp(min=1)).sqrt()  # centred is 0 outside `compared`
    return decision_adv + _scaled(centred, rms, eps)


def _scaled(centred: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """centred / (scale + eps), 0 where scale is 0 (then every centred value is 0 too: nothing to scale)."""
    return centred / (scale + eps) if float(scale) > 0 else torch.zeros_like(centred)
