"""The GRPO objective on sampled tokens: PPO-clipped surrogate + beta * KL(pi || pi_ref) (k3), in four variants.

    ratio_t  = exp(logp_t - old_logp_t)              gspo: one ratio per response, exp(mean_t (logp_t - old_logp_t))
    surr_t   = min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)
    kl_t     = exp(ref_logp_t - logp_t) - (ref_logp_t - logp_t) - 1        (k3: unbiased, >= 0)
    loss_t   = -w_t * surr_t + beta * kl_t

w_t is 1, except with one-step-off async (rl.async_level=1): the samples came from the weights before the previous
update, so the surrogate is weighted by the truncated importance weight w_t = min(exp(old_logp_t - sampler_logp_t),
cap), detached (pi_old / pi_sampler: the learner's weights before this update against the engine that sampled).

`rl.loss` says how loss_t becomes the loss of the global batch (B responses, |o_i| tokens in response i, N tokens in
all, L = rollout.max_new_tokens):
    dapo     sum_{i,t} loss_t / N                   a global token mean (today's default)
    grpo     1/B sum_i 1/|o_i| sum_t loss_t          the paper's per-sequence mean
    dr_grpo  sum_{i,t} loss_t / (B * L)              a constant normaliser (Dr. GRPO)
    gspo     as grpo, with the sequence ratio
`grpo_loss` gives one micro-batch's loss as a mean over its own `loss_units` (tokens for dapo, responses otherwise);
the step weighs it by units / the global batch's units, so the sum over micro-batches and ranks is the form above.
Shapes: B responses, T tokens (right-padded; `mask` is 1 on the tokens that train).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shop_r1.config import LossConfig, LossVariant


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch's tensors for the loss."""

    logp: torch.Tensor  # [B, T] the policy's logprobs of the sampled tokens (with gradient)
    old_logp: torch.Tensor  # [B, T] the same before this update (no gradient)
    advantages: torch.Tensor  # [B] one per response, broadcast over its tokens
    mask: torch.Tensor  # [B, T] 1 on the tokens that train
    ref_logp: torch.Tensor | None = None  # [B, T] the frozen reference's; None: no KL term
    is_weight: torch.Tensor | None = None  # [B, T] the importance weights w_t (no gradient); None: all 1


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # [] the micro-batch's loss, a mean over its `loss_units`, to backpropagate
    kl: float  # mean k3 KL over tokens
    clip_fraction: float  # share of tokens whose ratio was clipped (the clip changed the objective)
    ratio_mean: float  # token mean of the ratio (gspo: of each token's sequence ratio)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) from the sampled tokens' logprobs (Schulman's approximator)."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def truncated_is_weight(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """w_t = min(pi_old / pi_sampler, cap) per token, without gradient ([B, T] -> [B, T])."""
    return torch.exp(old_logp.detach() - sampler_logp.to(old_logp.dtype)).clamp(max=cap)


def loss_units(mask: torch.Tensor, loss: LossVariant) -> float:
    """What a micro-batch's loss is a mean over: its tokens (dapo), else its responses with at least one token."""
    if loss == "dapo":
        return float(mask.sum())
    return float((mask.sum(dim=1) > 0).sum())


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def aggregate(values: torch.Tensor, mask: torch.Tensor, loss: LossVariant, max_new_tokens: int = 1) -> torch.Tensor:
    """[B, T] per-token values -> the micro-batch's mean over its `loss_units` (module docstring)."""
    if loss == "dapo":
        return token_mean(values, mask)
    mask = mask.to(values.dtype)
    responses = (mask.sum(dim=1) > 0).sum().clamp(min=1).to(values.dtype)
    if loss == "dr_grpo":
        return (values * mask).sum() / (responses * max_new_tokens)
    per_response = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # 0 for a row without tokens
    return per_response.sum() / responses


def grpo_loss(inputs: LossInputs, cfg: LossConfig) -> LossOutput:
    logp, mask = inputs.logp, inputs.mask
    adv = inputs.advantages.to(logp.dtype).unsqueeze(1)  # [B, 1]
    log_ratio = logp - inputs.old_logp
    if cfg.loss == "gspo":  # [B, 1]: the mean log ratio over each response's tokens
        m = mask.to(logp.dtype)
        log_ratio = (log_ratio * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(min=1.0)
    ratio = torch.exp(log_ratio).expand_as(logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    per_token = -surrogate if inputs.is_weight is None else -surrogate * inputs.is_weight.detach().to(logp.dtype)
    kl_mean = 0.0
    if inputs.ref_logp is not None and cfg.kl_beta != 0.0:
        kl = k3_kl(logp, inputs.ref_logp)
        per_token = per_token + cfg.kl_beta * kl
        kl_mean = float(token_mean(kl.detach(), mask))
    loss = aggregate(per_token, mask, cfg.loss, cfg.max_new_tokens)
    with torch.no_grad():
        was_clipped = (clipped < unclipped).to(logp.dtype)  # min() took the clipped branch
        clip_fraction = float(token_mean(was_clipped, mask))
        ratio_mean = float(token_mean(ratio, mask))
    return LossOutput(loss, kl_mean, clip_fraction, ratio_mean)
