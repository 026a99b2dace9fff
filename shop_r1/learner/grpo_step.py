"""One rank's GRPO update and its no-grad forwards, written once against `TrainingRank` (shop_r1/learner/protocol.py:
the learner rank, shop_r1/learner/rank.py, over whichever backend); the learner rank delegates here.

    mini-batches (rl.num_minibatches blocks of rows, `minibatch_rows`), each cut into micro-batches (a token budget
    each; every rank makes as many, see `micro_batches`)
    -> no-grad: the old logprobs (only with several mini-batches) and the reference's
    -> per mini-batch: each micro-batch's forward, loss (shop_r1/algo/grpo_loss.py) and backward of its share of the
       mini-batch's global loss; then one optimizer step
    -> the step's figures, summed over every rank's tokens (`StepSums`), as GRPOStepStats

`grpo_update_with_self_certainty` (reward.self_certainty.source=update_logits) is the same update of the step's whole
batch whose forwards also give s(r) and, from it, the advantages (every forward first, then one backward; where
rl.self_certainty_breaks_ties=false the dropped groups are known first and forward without gradient).

Loss scaling: a micro-batch's loss is a mean over its own `loss_units` (tokens for dapo, else responses); weighted by
its units / the global batch's (all-reduced), the accumulated gradient over micro-batches and ranks is exactly the
loss of the global batch (rl.loss) however it was split. The backend's backward sums over ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from shop_r1.algo import finite
from shop_r1.algo.batch import GRPOBatch, micro_batch_rows
from shop_r1.algo.grpo_loss import LossInputs, grpo_loss, loss_units, truncated_is_weight
from shop_r1.algo.step_rewards import (
    StepRewards,
    UpdateWithSelfCertainty,
    kept_rows,
    kept_rows_before_self_certainty,
    totals_and_advantages,
    update_rows,
)
from shop_r1.config import AdvantageConfig, LossConfig
from shop_r1.learner.forward import Forward
from shop_r1.learner.protocol import TrainingRank
from shop_r1.types import GRPOStepStats


def forward_of(backend: TrainingRank, pack: bool = False) -> Forward:
    """The backend's forward math; `pack` (learner.pack_sequences): sequence packing (shop_r1/algo/packing.py)."""
    return Forward(backend.device, backend.cfg.shared_prompt, pack, backend.cfg.attention,
                   backend.cfg.last_layer_at_targets)


def micro_batches(backend: TrainingRank, batch: GRPOBatch, pack: bool = False) -> list[GRPOBatch]:
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

    loss: float = 0.0  # this rank's share of the global loss, averaged over the mini-batches
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

    def all_reduced(self, backend: TrainingRank) -> StepSums:
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


def minibatch_rows(num_rows: int, num_minibatches: int) -> list[list[int]]:
    """A rank's rows (batch order) in `num_minibatches` consecutive blocks as even as the count allows, one per
    optimizer step (rl.num_minibatches); a block is empty where a rank has fewer rows than mini-batches. Every rank
    makes the same number of blocks, so each optimizer step is one collective step under ZeRO/FSDP."""
    bounds = [num_rows * k // num_minibatches for k in range(num_minibatches + 1)]
    return [list(range(bounds[k], bounds[k + 1])) for k in range(num_minibatches)]


def grpo_update(backend: TrainingRank, batch: GRPOBatch, cfg: LossConfig, step: int,
                pack: bool = False) -> GRPOStepStats:
    """One rollout batch: reference and old logprobs, then `cfg.num_minibatches` clipped-surrogate updates, each on
    its own block of rows (`minibatch_rows`), cut into micro-batches of its own.

    `batch` is this rank's share (any size, even empty); the figures are over the global batch, labelled `step`.
    `pack`: micro-batches sequence-packed (learner.pack_sequences), the same loss and gradient as padded.
    """
    forward, policy = forward_of(backend, pack), backend.policy
    minis = [micro_batches(backend, batch if cfg.num_minibatches == 1 else batch.select(rows), pack)
             for rows in minibatch_rows(batch.num_responses, cfg.num_minibatches)]
    minis = [micro for micro in minis if micro]  # empty on every rank (fewer rows than mini-batches): no step
    with torch.no_grad():
        # With one update per rollout batch the policy is still the sampler: old == current, so the ratio is
        # exactly 1 and its detached logprobs serve as `old` without a second forward pass.
        old = [[forward.completion_logprobs(policy, mb) if cfg.num_minibatches > 1 else None for mb in micro]
               for micro in minis]
        ref = [[forward.completion_logprobs(backend.reference, mb) if backend.reference is not None else None
                for mb in micro] for micro in minis]
    # Global denominators, one per mini-batch: the loss units (tokens or responses) of every rank.
    local = [sum(loss_units(mb.completion_mask, cfg.loss) for mb in micro) for micro in minis]
    denominators = backend.all_reduce(torch.tensor(local, dtype=torch.float64)).tolist() if minis else []
    sums, grad_norms, causes = StepSums(), [], []
    for micro, old_mini, ref_mini, denominator in zip(minis, old, ref, denominators):
        losses = []
        for mb, old_logp, ref_logp in zip(micro, old_mini, ref_mini):
            backend.begin_micro_batch()
            logp = forward.completion_logprobs(policy, mb)
            weighted, loss, mb_sums = _micro_batch_loss(backend, mb, logp, old_logp, ref_logp, cfg, denominator,
                                                        len(minis))
            backend.backward(weighted)
            losses.append(loss)
            sums = sums + mb_sums
        done = backend.optimizer_step(losses)
        grad_norms.append(done.grad_norm)
        causes.append(done.nonfinite)
    return _step_stats(backend, sums, grad_norms, causes, cfg, step)


def _micro_batch_loss(backend: TrainingRank, mb: GRPOBatch, logp: torch.Tensor, old: torch.Tensor | None,
                      ref: torch.Tensor | None, cfg: LossConfig, denominator: float, num_minibatches: int
                      ) -> tuple[torch.Tensor, float, StepSums]:
    """One micro-batch's share of the global loss (its loss, weighted by its loss units / `denominator`: what to
    backpropagate), its loss, and its figures, from its policy logprobs `logp` (with gradient).
    `mb.completion_mask` says which tokens train."""
    mask = mb.completion_mask.to(backend.device)
    old_logp = old if old is not None else logp.detach()
    sampler = mb.sampler_logprobs.to(backend.device, logp.dtype)
    # One-step-off samples came from the weights before the previous update: correct the surrogate.
    weight_is = truncated_is_weight(old_logp, sampler, cfg.async_is_cap) if cfg.async_is_cap is not None else None
    out = grpo_loss(LossInputs(logp, old_logp, mb.advantages.to(backend.device), mask, ref, weight_is), cfg)
    weight = loss_units(mb.completion_mask, cfg.loss) / denominator if denominator > 0 else 0.0
    # The sampling weights' logprobs (`old` when there are several updates, else this pass's, which runs before any
    # update of this batch), against the engine's: the two sides must agree.
    trained = mask.bool()
    diff = (old_logp - sampler)[trained].abs()
    n_tokens = float(mask[:, 1:].sum())
    return out.loss * weight, float(out.loss.detach()), StepSums(
        loss=float(out.loss.detach()) * weight / num_minibatches, kl=out.kl * n_tokens,
        clipped=out.clip_fraction * n_tokens, ratio=out.ratio_mean * n_tokens, tokens=n_tokens,
        sampler_abs_diff=float(diff.double().sum()),
        is_weight=float(weight_is[trained].double().sum()) if weight_is is not None else 0.0,
        is_truncated=float((weight_is[trained] >= cfg.async_is_cap).double().sum()) if weight_is is not None else 0.0,
        sampler_abs_diff_max=float(diff.max()) if diff.numel() else 0.0)


def _step_stats(backend: TrainingRank, sums: StepSums, grad_norms: list[float], causes: list[str],
                cfg: LossConfig, step: int) -> GRPOStepStats:
    """The step's figures over every rank, or the skipped step's when an optimizer step was skipped."""
    sums = sums.all_reduced(backend)
    cause = next((c for c in causes if c), "")
    if cause:  # (one of) the update(s) skipped: nothing non-finite reaches the logs (the cause says what was)
        return GRPOStepStats(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_mean=1.0, grad_norm=0.0,
                             num_tokens=int(round(sums.tokens)), step=step, nonfinite=cause)
    return sums.stats(sum(grad_norms) / len(grad_norms) if grad_norms else 0.0, step, cfg.async_is_cap is not None)


def grpo_update_with_self_certainty(backend: TrainingRank, batch: GRPOBatch, cfg: LossConfig,
                                    rewards: StepRewards, adv_cfg: AdvantageConfig, first_row: int, step: int,
                                    pack: bool = False) -> UpdateWithSelfCertainty:
    """reward.self_certainty.source=update_logits: one GRPO update whose own forward also gives every response's
    exact s(r), so that no forward runs for s(r) alone.

    `batch` is this rank's share of the step's *whole* batch (every group, advantages not yet known): rows
    [first_row, first_row + n) of the `rewards` (every response's, [P][G]). On each rank:
      1. the forwards: s(r) of each row from the logits (detached, unscaled: temperature 1; the same numbers as
         `rationale_self_certainty`'s extra forward, at the same weights: nothing has stepped yet). Where the rows
         to train are known before s(r) (rl.self_certainty_breaks_ties=false: `kept_rows_before_self_certainty`),
         the rows of dropped zero-signal groups (rl.drop_zero_signal_groups) run in micro-batches of their own
         without gradient (`rationale_self_certainty`), then the kept rows' with gradient, graphs kept; else every
         micro-batch's forward runs with gradient
      2. every response's s(r) on every rank (a zero-padded [B] vector summed over ranks)
      3. the totals re-formed and the advantages computed as the driver does (shop_r1/algo/step_rewards.py), so
         every rank holds the same; the rows of dropped groups train no token and count in no denominator
      4. the reference's logprobs, each micro-batch's loss (as `grpo_update`), one backward of their sum (the same
         gradient as a backward each: FSDP2 reshards after a backward, freeing what the other graphs hold), one
         optimizer step
    Cost, against `rationale_self_certainty`'s no-grad forward of every row then `grpo_update` of the kept rows:
    with rl.self_certainty_breaks_ties=false, a no-grad forward of the dropped rows and the forward, backward and
    reference of the kept rows: that path less the kept rows' no-grad forward, always cheaper. With it true (s(r)
    decides which groups tie), every row's forward with gradient, and the backward through every micro-batch that
    holds a kept row, dropped rows included (a micro-batch of dropped rows only is let go): with
    rl.drop_zero_signal_groups and many zero-signal groups it can cost more than it saves.
    Memory: every micro-batch's graph of this rank (the kept rows' only, where they are known first) is alive at
    once until the backward (step 4), so the peak is the activations of the whole share, not of one micro-batch
    (gradient checkpointing, learner.gradient_checkpointing, keeps that to each layer's input). One mini-batch only
    (`cfg.num_minibatches` = 1: the config refuses more). Under ZeRO-3 and FSDP2 every rank makes as many no-grad
    and as many grad forwards (`micro_batches` pads each kind), whatever its share holds.

    Nothing is trained when no row is left (every group dropped) or a reward or advantage is NaN/inf (that cause is
    in `stats.nonfinite`): every rank sees the same advantages, so every rank skips alike, and `updated` is False.
    """
    if cfg.num_minibatches != 1:
        raise ValueError(f"grpo_update_with_self_certainty takes one mini-batch per step, got {cfg.num_minibatches} "
                         "(rl.num_minibatches; reward.self_certainty.source=update_logits needs 1)")
    direction, normalize = adv_cfg.reward.self_certainty.direction, adv_cfg.reward.self_certainty.normalize_by_vocab
    forward, policy, n = forward_of(backend, pack), backend.policy, batch.num_responses
    known = kept_rows_before_self_certainty(rewards, adv_cfg)  # the same on every rank (global inputs)
    known_set = set(range(first_row, first_row + n)) if known is None else set(known)
    grad_rows = [i for i in range(n) if first_row + i in known_set]
    mine = [0.0] * n
    if known is not None:                                               # 1. forwards, s(r): the dropped rows'
        no_grad_rows = [i for i in range(n) if first_row + i not in known_set]
        dropped = micro_batches(backend, batch.select(no_grad_rows), pack)
        with torch.no_grad():
            for mb, rows in zip(dropped, _rows_of(dropped, no_grad_rows)):
                for i, s in zip(rows, forward.rationale_self_certainty(policy, mb, direction, normalize)):
                    mine[i] = s
    micro = micro_batches(backend, batch.select(grad_rows), pack)       # the rows that may train
    micro_rows, logps = _rows_of(micro, grad_rows), []
    for mb, rows in zip(micro, micro_rows):
        logp, certainty = forward.completion_logprobs_and_self_certainty(policy, mb, direction, normalize)
        logps.append(logp)
        for i, s in zip(rows, certainty):
            mine[i] = s
    padded = torch.zeros(rewards.num_responses, dtype=torch.float64)                     # 2. every rank's s(r)
    padded[first_row:first_row + n] = torch.tensor(mine, dtype=torch.float64)
    values = backend.all_reduce(padded).tolist()
    owned = totals_and_advantages(rewards, adv_cfg, values)                                # 3. advantages
    reformed, adv = owned.rewards, owned.advantages
    flat, kept = adv.advantages.reshape(-1), set(kept_rows(adv, adv_cfg))
    if known is not None and kept != known_set:
        raise RuntimeError(f"the kept rows {sorted(kept)} differ from those known before s(r) {sorted(known)}")
    cause = finite.driver_cause(reformed.totals(), adv.advantages)
    if cause or not kept:  # every rank decides alike (the same global numbers): no backward anywhere
        skipped = GRPOStepStats(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_mean=1.0, grad_norm=0.0, num_tokens=0,
                                step=step, nonfinite=cause)
        return UpdateWithSelfCertainty(skipped, values, adv, updated=False)
    trained = []  # each micro-batch as the loss sees it: its advantages, dropped (and padding) rows masked out
    for mb, rows in zip(micro, micro_rows):
        pad = [0.0] * (mb.num_responses - len(rows))
        keep = torch.tensor([float(first_row + i in kept) for i in rows] + pad, dtype=mb.completion_mask.dtype)
        advantages = torch.tensor([float(flat[first_row + i]) for i in rows] + pad, dtype=torch.float64)
        trained.append(dataclasses.replace(mb, completion_mask=mb.completion_mask * keep.unsqueeze(1),
                                           advantages=advantages))
    with torch.no_grad():  # the reference is replicated on every rank (no collective): only where a token trains
        ref = [forward.completion_logprobs(backend.reference, mb)
               if backend.reference is not None and int(t.completion_mask.sum()) else None
               for mb, t in zip(micro, trained)]
    local = sum(loss_units(t.completion_mask, cfg.loss) for t in trained)                # 4. the update
    denominator = float(backend.all_reduce(torch.tensor([local], dtype=torch.float64))[0])
    sums, losses, parts = StepSums(), [], []
    for logp, t, r in zip(logps, trained, ref):
        weighted, loss, mb_sums = _micro_batch_loss(backend, t, logp, None, r, cfg, denominator, 1)
        parts.append((weighted, bool(int(t.completion_mask.sum()))))
        losses.append(loss)
        sums = sums + mb_sums
    # A micro-batch of dropped (or padding) rows only adds 0: its graph is let go, no backward runs through it (one
    # joins where none trains on this rank: every rank makes the backward, a collective under ZeRO-3 and FSDP2).
    parts = [w for w, trains in parts if trains] or [parts[0][0]]
    del logps
    backend.begin_micro_batch()  # the framework's bookkeeping before a backward (one here)
    backend.backward(sum(parts[1:], parts[0]))
    done = backend.optimizer_step(losses)
    return UpdateWithSelfCertainty(_step_stats(backend, sums, [done.grad_norm], [done.nonfinite], cfg, step), values,
                                   adv, updated=True)


def _rows_of(micro: list[GRPOBatch], rows: list[int]) -> list[list[int]]:
    """Each of `micro_batches`' micro-batches' rows (consecutive, taken from `rows`); none for a padding one."""
    out, start = [], 0
    for mb in micro:
        out.append(rows[start:start + mb.num_responses])
        start += mb.num_responses
    return out


@torch.no_grad()
def rationale_self_certainty(backend: TrainingRank, batch: GRPOBatch, direction: Literal["p_to_u", "u_to_p"],
                             normalize_by_vocab: bool = False, pack: bool = False) -> list[float]:
    """Exact s(r) per response of this rank's `batch` (one value each, 0 without rationale tokens) from the
    policy's full logits at temperature 1 (shop_r1/learner/forward.py). Every rank must call (ZeRO-3 and FSDP2
    forwards are collectives)."""
    forward, out = forward_of(backend, pack), []
    for mb in micro_batches(backend, batch, pack):
        out.extend(forward.rationale_self_certainty(backend.policy, mb, direction, normalize_by_vocab))
    return out[:batch.num_responses]  # without the padding rows of micro_batches


@torch.no_grad()
def probe_logprobs(backend: TrainingRank, batch: GRPOBatch, pack: bool = False) -> list[list[float]]:
    """The policy's logprobs on each response's completion tokens (for the weight-sync check)."""
    forward, out = forward_of(backend, pack), []
    for mb in micro_batches(backend, batch, pack):
        lp = forward.completion_logprobs(backend.policy, mb)
        for b in range(lp.shape[0]):
            out.append(lp[b][mb.completion_mask[b].bool().to(backend.device)].float().cpu().tolist())
    return out[:batch.num_responses]  # without the padding rows of micro_batches


def contiguous_share(n: int, rank: int, world_size: int) -> range:
    """Rank `rank`'s rows of n: [rank n / K, (rank + 1) n / K), contiguous and even (the learner group's split)."""
    return range(rank * n // world_size, (rank + 1) * n // world_size)


def grpo_update_after_self_certainty(backend: TrainingRank, batch: GRPOBatch, cfg: LossConfig, rewards: StepRewards,
                                     adv_cfg: AdvantageConfig, action_only: bool, rank: int, world_size: int,
                                     step: int, pack: bool = False,
                                     update: Callable[[GRPOBatch], GRPOStepStats] | None = None
                                     ) -> UpdateWithSelfCertainty:
    """reward.self_certainty.source=learner_logits in one learner call: `batch` is the step's *whole* batch (every
    group, advantages not yet known), on every rank. Each rank
      1. takes s(r) of its contiguous share of the rows (`rationale_self_certainty`: no-grad, temperature 1),
      2. sums the zero-padded [B] vector over ranks: every response's s(r) on every rank,
      3. re-forms the totals and computes the advantages (`totals_and_advantages`, the driver's function),
      4. selects the rows to train (`update_rows`) and runs `grpo_update` on its contiguous share of them:
    the same forwards, micro-batches and numbers as the driver's two calls (s(r), then the update of the kept batch),
    in one. `update`: what trains the share (the learner rank passes its own `grpo_step`, so the update is the one
    every source runs; default `grpo_update` at `step`). Nothing is trained when no row is left or a reward or
    advantage is NaN/inf (`stats.nonfinite`): every rank sees the same numbers and skips alike, `updated` False."""
    direction = adv_cfg.reward.self_certainty.direction
    normalize = adv_cfg.reward.self_certainty.normalize_by_vocab
    world = world_size
    mine = contiguous_share(batch.num_responses, rank, world)
    share = batch if world == 1 else batch.select(mine)
    values_mine = rationale_self_certainty(backend, share, direction, normalize, pack)     # 1. this rank's s(r)
    padded = torch.zeros(batch.num_responses, dtype=torch.float64)                        # 2. every response's
    padded[mine.start:mine.stop] = torch.tensor(values_mine, dtype=torch.float64)
    values = backend.all_reduce(padded).tolist()
    owned = totals_and_advantages(rewards, adv_cfg, values)                               # 3. the advantages
    cause = finite.driver_cause(owned.rewards.totals(), owned.advantages.advantages)
    trained = update_rows(batch, owned.advantages, adv_cfg, action_only)                  # 4. the update
    if cause or not trained.num_responses:
        skipped = GRPOStepStats(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_mean=1.0, grad_norm=0.0, num_tokens=0,
                                step=step, nonfinite=cause)
        return UpdateWithSelfCertainty(skipped, values, owned.advantages, updated=False)
    share = trained if world == 1 else trained.select(contiguous_share(trained.num_responses, rank, world))
    stats = update(share) if update is not None else grpo_update(backend, share, cfg, step=step, pack=pack)
    return UpdateWithSelfCertainty(stats, values, owned.advantages, updated=True)
