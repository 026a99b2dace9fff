"""The GRPO objective on sampled tokens: PPO-clipped surrogate + beta * KL(pi || pi_ref) (k3 estimator).

    ratio_t  = exp(logp_t - old_logp_t)
    surr_t   = min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)
    kl_t     = exp(ref_logp_t - logp_t) - (ref_logp_t - logp_t) - 1        (k3: unbiased, >= 0)
    loss_t   = -w_t * surr_t + beta * kl_t

w_t is 1, except with one-step-off async (rl.async_level=1): the samples came from the weights before the previous
update, so the surrogate is weighted by the truncated importance weight w_t = min(exp(old_logp_t - sampler_logp_t),
cap), detached (pi_old / pi_sampler: the learner's weights before this update against the engine that sampled).

Aggregation: "token" averages loss_t over every response token of the batch (long answers weigh more);
"sequence" averages within each response first, then over responses (GRPO's original 1/|o_i| form).
Shapes: B responses, T response tokens (right-padded; `mask` is 1 on real tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True)
class GRPOLossOutput:
    loss: torch.Tensor  # [] the value to backpropagate
    policy_loss: float  # mean of -surr over the aggregation
    kl: float  # mean k3 KL over tokens
    clip_fraction: float  # share of tokens whose ratio was clipped (the clip changed the objective)
    ratio_mean: float


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) from the sampled tokens' logprobs (Schulman's approximator)."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: Literal["token", "sequence"]) -> torch.Tensor:
    mask = mask.to(values.dtype)
    if mode == "token":
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return per_seq.mean()


def truncated_is_weight(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """w_t = min(pi_old / pi_sampler, cap) per token, without gradient ([B, T] -> [B, T])."""
    return torch.exp(old_logp.detach() - sampler_logp.to(old_logp.dtype)).clamp(max=cap)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None, advantages: torch.Tensor,
              mask: torch.Tensor, clip_eps_low: float, clip_eps_high: float, kl_beta: float,
              aggregation: Literal["token", "sequence"] = "token",
              behavior_weight: torch.Tensor | None = None) -> GRPOLossOutput:
    """logp/old_logp/ref_logp/mask: [B, T]; advantages: [B] (one per response, broadcast over its tokens);
    behavior_weight: [B, T] or None (the importance weights w_t, no gradient)."""
    adv = advantages.to(logp.dtype).unsqueeze(1)  # [B, 1]
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    per_token = -surrogate if behavior_weight is None else -surrogate * behavior_weight.detach().to(logp.dtype)
    kl_mean = 0.0
    if ref_logp is not None and kl_beta != 0.0:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + kl_beta * kl
        kl_mean = float(aggregate(kl.detach(), mask, "token"))
    loss = aggregate(per_token, mask, aggregation)
    with torch.no_grad():
        m = mask.to(logp.dtype)
        was_clipped = (clipped < unclipped).to(logp.dtype)  # min() took the clipped branch
        clip_fraction = float((was_clipped * m).sum() / m.sum().clamp(min=1.0))
        ratio_mean = float((ratio * m).sum() / m.sum().clamp(min=1.0))
        policy_loss = float(aggregate(-surrogate, mask, aggregation))
    return GRPOLossOutput(loss, policy_loss, kl_mean, clip_fraction, ratio_mean)
