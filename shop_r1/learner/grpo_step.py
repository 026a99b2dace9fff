"""One rank's GRPO update and its no-grad forwards, written once against the backend protocol
(shop_r1/learner/backend.py); every backend's learner delegates here.

    micro-batches (a token budget each; every rank makes as many, see `micro_batches`)
    -> no-grad: the old logprobs (only with several mini-batches) and the reference's
    -> per mini-batch group: each micro-batch's forward, loss (shop_r1/algo/grpo_loss.py) and backward of its share
       of the global loss; then one optimizer step
    -> the step's figures, summed over every rank's tokens (`StepSums`), as GRPOStepStats

Loss scaling: a micro-batch's loss is a mean over its own `loss_units` (tokens for dapo, else responses); weighted by
its units / the global batch's (all-reduced), the accumulated gradient over micro-batches and ranks is exactly the
loss of the global batch (rl.loss) however it was split. The backend's backward sums over ranks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch

from shop_r1.algo.batch import GRPOBatch, micro_batch_rows
from shop_r1.algo.grpo_loss import LossInputs, grpo_loss, loss_units, truncated_is_weight
from shop_r1.config import LossConfig
from shop_r1.learner.backend import TrainingBackend
from shop_r1.learner.forward import Forward
from shop_r1.types import GRPOStepStats


def forward_of(backend: TrainingBackend, pack: bool = False) -> Forward:
    """The backend's forward math; `pack` (learner.pack_sequences): sequence packing (shop_r1/algo/packing.py)."""
    return Forward(backend.device, backend.cfg.shared_prompt, pack, backend.cfg.attention)


def micro_batches(backend: TrainingBackend, batch: GRPOBatch, pack: bool = False) -> list[GRPOBatch]:
    """This rank's micro-batches, each trimmed to its own longest row, padded with empty ones to the largest count
    over all ranks.

    Consecutive rows fill a micro-batch up to `learner.max_tokens_per_micro_batch` padded tokens, counted as the
    forward will run them (packed per prompt under `learner.shared_prompt`, end to end with `pack`). Under ZeRO-3
    and FSDP2 every forward and backward is a collective, so every rank must make the same number of them whatever
    its share (an uneven split, or no responses at all): a rank short of micro-batches runs empty ones, whose rows
    train no token (completion mask 0), so they add nothing to the loss or the gradient.
    """
    from shop_r1.algo.shared_prompt import prefix_lengths

    lengths = [int(n) for n in batch.attention_mask.sum(dim=1).tolist()]
    prompts = None
    if backend.cfg.shared_prompt:
        prefixes, ids = prefix_lengths(batch.completion_mask, batch.attention_mask), batch.input_ids.tolist()
        prompts = [(p, tuple(ids[b][:p])) for b, p in enumerate(prefixes)]
    out = [batch.select(rows).trimmed()
           for rows in micro_batch_rows(lengths, backend.cfg.max_tokens_per_micro_batch, prompts, pack)]
    count = int(backend.all_reduce(torch.tensor([len(out)], dtype=torch.float64), "max")[0])
    return out + [batch.empty_like(rows=1)] * (count - len(out))


@dataclass(frozen=True)
class StepSums:
    """One rank's sums over its trained tokens (token-weighted where a figure is per token); `all_reduced` makes
    them the global batch's."""

    loss: float = 0.0  # this rank's share of the global loss, averaged over the mini-batch groups
    kl: float = 0.0  # sum over micro-batches of (mean k3 KL x tokens)
    clipped: float = 0.0  # tokens whose ratio was clipped
    ratio: float = 0.0  # sum of the ratio over tokens
    tokens: float = 0.0  # trained tokens
    sampler_abs_diff: float = 0.0  # sum of |learner logprob - engine logprob| (the learner's before this update)
    is_weight: float = 0.0  # sum of the importance weights (one-step-off)
    is_truncated: float = 0.0  # tokens whose importance weight hit the cap
    sampler_abs_diff_max: float = 0.0  # the largest |learner logprob - engine logprob| (max over ranks)

    def __add__(self, other: StepSums) -> StepSums:
        summed = [a + b for a, b in zip(dataclasses.astuple(self)[:-1], dataclasses.astuple(other)[:-1])]
        return StepSums(*summed, max(self.sampler_abs_diff_max, other.sampler_abs_diff_max))

    def all_reduced(self, backend: TrainingBackend) -> StepSums:
        summed = backend.all_reduce(torch.tensor(dataclasses.astuple(self)[:-1], dtype=torch.float64))
        top = backend.all_reduce(torch.tensor([self.sampler_abs_diff_max], dtype=torch.float64), "max")
        return StepSums(*summed.tolist(), float(top[0]))

    def stats(self, grad_norm: float, step: int, corrected: bool) -> GRPOStepStats:
        """The global sums as the step's figures; `corrected`: the importance weight was on (one-step-off)."""
        tokens = self.tokens
        return GRPOStepStats(loss=self.loss, kl=self.kl / max(tokens, 1.0),
                             clip_fraction=self.clipped / max(tokens, 1.0),
                             ratio_mean=self.ratio / tokens if tokens else 1.0, grad_norm=grad_norm,
                             num_tokens=int(round(tokens)), step=step,
                             sampler_logprob_abs_diff_mean=self.sampler_abs_diff / max(tokens, 1.0),
                             sampler_logprob_abs_diff_max=self.sampler_abs_diff_max,
                             is_weight_mean=self.is_weight / tokens if tokens and corrected else 1.0,
                             is_truncated_fraction=self.is_truncated / max(tokens, 1.0))


def grpo_update(backend: TrainingBackend, batch: GRPOBatch, cfg: LossConfig, step: int,
                pack: bool = False) -> GRPOStepStats:
    """One rollout batch: reference and old logprobs, then `cfg.num_minibatches` clipped-surrogate updates.

    `batch` is this rank's share (any size, even empty); the figures are over the global batch, labelled `step`.
    `pack`: micro-batches sequence-packed (learner.pack_sequences), the same loss and gradient as padded.
    """
    forward, policy = forward_of(backend, pack), backend.policy
    micro = micro_batches(backend, batch, pack)
    with torch.no_grad():
        # With one update per rollout batch the policy is still the sampler: old == current, so the ratio is
        # exactly 1 and its detached logprobs serve as `old` without a second forward pass.
        old = [forward.completion_logprobs(policy, mb) if cfg.num_minibatches > 1 else None for mb in micro]
        ref = [forward.completion_logprobs(backend.reference, mb) if backend.reference is not None else None
               for mb in micro]
    groups = [list(range(i, len(micro), cfg.num_minibatches)) for i in range(min(cfg.num_minibatches, len(micro)))]
    # Global denominators, one per mini-batch group: the loss units (tokens or responses) of every rank.
    local = [sum(loss_units(micro[i].completion_mask, cfg.loss) for i in group) for group in groups]
    denominators = backend.all_reduce(torch.tensor(local, dtype=torch.float64)).tolist() if groups else []
    sums, grad_norms, causes = StepSums(), [], []
    for group, denominator in zip(groups, denominators):
        losses = []
        for i in group:
            mb = micro[i]
            mask = mb.completion_mask.to(backend.device)
            backend.begin_micro_batch()
            logp = forward.completion_logprobs(policy, mb)
            old_logp = old[i] if old[i] is not None else logp.detach()
            sampler = mb.sampler_logprobs.to(backend.device, logp.dtype)
            # One-step-off samples came from the weights before the previous update: correct the surrogate.
            weight_is = truncated_is_weight(old_logp, sampler, cfg.async_is_cap) \
                if cfg.async_is_cap is not None else None
            out = grpo_loss(LossInputs(logp, old_logp, mb.advantages.to(backend.device), mask, ref[i], weight_is), cfg)
            weight = loss_units(mb.completion_mask, cfg.loss) / denominator if denominator > 0 else 0.0
            backend.backward(out.loss * weight)
            losses.append(float(out.loss.detach()))
            # The sampling weights' logprobs (`old` when there are several updates, else this pass's, which runs
            # before any update of this batch), against the engine's: the two sides must agree.
            trained = mask.bool()
            diff = (old_logp - sampler)[trained].abs()
            n_tokens = float(mask[:, 1:].sum())
            sums = sums + StepSums(
                loss=float(out.loss.detach()) * weight / len(groups), kl=out.kl * n_tokens,
                clipped=out.clip_fraction * n_tokens, ratio=out.ratio_mean * n_tokens, tokens=n_tokens,
                sampler_abs_diff=float(diff.double().sum()),
                is_weight=float(weight_is[trained].double().sum()) if weight_is is not None else 0.0,
                is_truncated=float((weight_is[trained] >= cfg.async_is_cap).double().sum())
                if weight_is is not None else 0.0,
                sampler_abs_diff_max=float(diff.max()) if diff.numel() else 0.0)
        done = backend.optimizer_step(losses)
        grad_norms.append(done.grad_norm)
        causes.append(done.nonfinite)
    sums = sums.all_reduced(backend)
    cause = next((c for c in causes if c), "")
    if cause:  # (one of) the update(s) skipped: nothing non-finite reaches the logs (the cause says what was)
        return GRPOStepStats(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_mean=1.0, grad_norm=0.0,
                             num_tokens=int(round(sums.tokens)), step=step, nonfinite=cause)
    return sums.stats(sum(grad_norms) / len(grad_norms) if grad_norms else 0.0, step, cfg.async_is_cap is not None)


@torch.no_grad()
def rationale_self_certainty(backend: TrainingBackend, batch: GRPOBatch, direction: Literal["p_to_u", "u_to_p"],
                             normalize_by_vocab: bool = False, pack: bool = False) -> list[float]:
    """Exact s(r) per response of this rank's `batch` (one value each, 0 without rationale tokens) from the
    policy's full logits at temperature 1 (shop_r1/learner/forward.py). Every rank must call (ZeRO-3 and FSDP2
    forwards are collectives)."""
    forward, out = forward_of(backend, pack), []
    for mb in micro_batches(backend, batch, pack):
        out.extend(forward.rationale_self_certainty(backend.policy, mb, direction, normalize_by_vocab))
    return out[:batch.num_responses]  # without the padding rows of micro_batches


@torch.no_grad()
def probe_logprobs(backend: TrainingBackend, batch: GRPOBatch, pack: bool = False) -> list[list[float]]:
    """The policy's logprobs on each response's completion tokens (for the weight-sync check)."""
    forward, out = forward_of(backend, pack), []
    for mb in micro_batches(backend, batch, pack):
        lp = forward.completion_logprobs(backend.policy, mb)
        for b in range(lp.shape[0]):
            out.append(lp[b][mb.completion_mask[b].bool().to(backend.device)].float().cpu().tolist())
    return out[:batch.num_responses]  # without the padding rows of micro_batches
