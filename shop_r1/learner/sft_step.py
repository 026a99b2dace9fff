"""One rank's SFT step and its eval loss, written once against `TrainingRank` (shop_r1/learner/protocol.py), as the
GRPO step is (shop_r1/learner/grpo_step.py); the learner rank (shop_r1/learner/rank.py) delegates here.

Loss scaling: every micro-batch contributes sum(token losses) / num_loss_tokens_global, so the accumulated gradient
over micro-batches and ranks (the backend's backward sums over ranks) is the token mean of the global batch, however
it was split.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shop_r1.learner.forward import Forward
from shop_r1.learner.protocol import TrainingRank
from shop_r1.learner.sft_data import MicroBatch
from shop_r1.types import SFTStepStats


def sft_update(backend: TrainingRank, micro_batches: Sequence[MicroBatch], num_loss_tokens_global: int,
               step: int) -> SFTStepStats:
    """One optimizer step on this rank's `micro_batches` (any number, even none); the figures are this rank's,
    labelled `step`. A skipped step (a non-finite loss or gradient norm on any rank) reports loss and norm 0."""
    if num_loss_tokens_global <= 0:
        raise ValueError("sft_step: the global batch has no assistant tokens to learn from")
    losses = []
    batches = list(micro_batches) or [empty_micro_batch()]  # an idle rank still joins the collectives
    for mb in batches:
        backend.begin_micro_batch()
        loss = token_loss_sum(backend, mb) / num_loss_tokens_global
        backend.backward(loss)
        losses.append(float(loss.detach()))
    lr = backend.scheduler.get_last_lr()[0]
    done = backend.optimizer_step(losses)
    num_tokens = sum(mb.num_loss_tokens for mb in micro_batches)
    if done.nonfinite:  # skipped: nothing non-finite reaches the logs (the cause says what was)
        return SFTStepStats(loss=0.0, num_tokens=num_tokens, grad_norm=0.0, lr=lr, step=step,
                            nonfinite=done.nonfinite)
    return SFTStepStats(loss=sum(losses), num_tokens=num_tokens, grad_norm=done.grad_norm, lr=lr, step=step)


@torch.no_grad()
def eval_loss(backend: TrainingRank, micro_batches: Sequence[MicroBatch]) -> float:
    """The token mean of the loss over `micro_batches` (0 without loss tokens). Every rank must call (ZeRO-3 and
    FSDP2 forwards are collectives)."""
    total = sum(float(token_loss_sum(backend, mb)) for mb in micro_batches)
    tokens = sum(mb.num_loss_tokens for mb in micro_batches)
    return total / max(tokens, 1)


def token_loss_sum(backend: TrainingRank, mb: MicroBatch) -> torch.Tensor:
    """-(sum of the policy's logprobs of the loss tokens of `mb`): a scalar on the backend's device."""
    forward = Forward(backend.device, last_layer_at_targets=backend.cfg.last_layer_at_targets)
    return -forward.target_logprobs(backend.policy, mb.input_ids, mb.attention_mask, mb.loss_mask).sum()


def empty_micro_batch() -> MicroBatch:
    """One row of two tokens with no loss token: a forward and backward that add nothing (an idle rank's)."""
    one = torch.zeros((1, 2), dtype=torch.long)
    return MicroBatch(one, torch.ones_like(one), torch.zeros_like(one), 0)
