"""The learner's forward math, one implementation for every backend and test: hidden states (shared prompts encoded
once), the LM head on target positions only, the logprobs of given tokens, and s(r) from full logits.

`model` is a Hugging Face causal LM (its transformer `model.model` and its `model.lm_head`), trained or frozen. Under
ZeRO-3 its parameters are partitioned, so every rank must run the same forwards (the step takes care of that).
Shapes: b rows, T tokens (right-padded), N = the rows' flattened positions, H hidden size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from shop_r1.algo.batch import GRPOBatch


@dataclass(frozen=True)
class Hidden:
    states: torch.Tensor  # [N, H] the final hidden states, flattened
    source: torch.Tensor  # [b, T] the index in `states` of the state that predicts row token t (the one at t - 1)


def picked_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [n, V], token_ids [n] -> [n]: log softmax(logits / temperature)[token], in float32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def self_certainty_from_logits(logits: torch.Tensor, direction: Literal["p_to_u", "u_to_p"],
                               normalize_by_vocab: bool = False) -> float:
    """s(r): the mean over the rationale tokens' logits [n, V] (at temperature 1) of their KL to the uniform
    distribution; divided by |V| when `normalize_by_vocab` (the paper's literal 1/|V|)."""
    from shop_r1.reward.self_certainty import kl_to_uniform_logits

    value = float(kl_to_uniform_logits(logits, direction).float().mean())
    return value / logits.shape[-1] if normalize_by_vocab else value


def _packing_saves(attention_mask: torch.Tensor) -> bool:
    """Whether packing right-padded rows [b, T] takes fewer lines than rows; when not, the rows run as they are (the
    same outputs, and the model's own causal mask, which SDPA runs faster than a 4D one)."""
    from shop_r1.algo.packing import first_fit_decreasing

    lengths = [int(n) for n in attention_mask.sum(dim=1).tolist()]
    return len(first_fit_decreasing(lengths, max(lengths, default=0))) < len(lengths)


def right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row of `attention_mask` [b, T] is ones then zeros. Then the model's own causal mask gives the
    real positions the outputs the padding mask gives (a real token never looks ahead, and every pad is after the
    row's last real token; position ids count from 0 either way), and transformers' SDPA runs it as `is_causal`,
    skipping the blocks above the diagonal, instead of a dense 4D mask: SFT steps of the main job 1.48x faster on
    CPU (benchmarks/bench_causal_mask.py). Pad positions' outputs differ, and nothing reads them."""
    mask = attention_mask.bool()
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


def _flex_ready(model: Any, device: torch.device) -> None:
    """Make `model` run FlexAttention (learner.attention=flex), once: the switch is kept, so gradient checkpointing's
    recomputation and later forwards use the same kernel. Loud where it cannot work. CUDA only: torch's CPU
    FlexAttention has no backward ("FlexAttention does not support backward on CPU", torch 2.13), and the forward
    that transformers compiles fails to build once the shapes change (inductor's CPU flex template: "C++ compile
    error ... cur_kvSplitSize8 was not declared"). A model without transformers' `set_attn_implementation`
    (learner.backend=fsdp2's wrapper) cannot be switched here."""
    if device.type != "cuda":
        raise ValueError(f"learner.attention=flex needs CUDA (here {device.type}): torch's FlexAttention has no CPU "
                         "backward, and its compiled CPU forward fails once shapes vary; use learner.attention=dense")
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"learner.attention=flex needs a transformers model to switch to flex_attention, got "
                         f"{type(model).__name__}; use learner.attention=dense with this backend")
    if config._attn_implementation != "flex_attention":
        model.set_attn_implementation("flex_attention")


@dataclass(frozen=True)
class Forward:
    """Forwards on `device`; with `shared_prompt` (learner.shared_prompt) GRPO rows that share a prompt encode it once
    (shop_r1/algo/shared_prompt.py: the same outputs and gradients as the separate rows); with `pack` rows (or packs)
    are laid end to end instead of padded to the longest (shop_r1/algo/packing.py: the same outputs and gradients).
    `attention` (learner.attention) is how packed lines attend: `dense`, the [n, 1, W, W] mask through the model's
    own attention (SDPA); `split`, each pack's prompt causally and its completions against it, two SDPA calls that
    compute no masked pair (shop_r1/learner/split_attention.py); or `flex`, the same mask as a block-sparse BlockMask
    through FlexAttention (CUDA)."""

    device: torch.device
    shared_prompt: bool = False
    pack: bool = False
    attention: Literal["dense", "split", "flex"] = "dense"
    last_layer_at_targets: bool = False
    """learner.last_layer_at_targets: the last decoder layer's query, MLP and final norm run only at the positions
    read (shop_r1/learner/target_states.py), where the model's layout allows: rows as they are, and packed lines
    (shared prompts, sequence packing) through the dense mask or the split pieces; not under `flex`."""

    def target_states(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, where: torch.Tensor,
                      completion_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[n, H] the final hidden states that predict the tokens `where` [b, T-1] marks (where[:, t]: the state at
        t, predicting token t + 1), in row-major order. Under ZeRO-3 every rank must call the modules in the same order:
        whether to run the last layer at the targets is chosen from the config and the model alone, and whether a
        rank's rows are packed (which with `pack` depends on them) changes only the inputs of `final_states_at`, not
        the modules it calls."""
        if self.last_layer_at_targets and self.attention != "flex":
            from shop_r1.learner import target_states

            if target_states.supports(model):
                packed = self._packed(input_ids, attention_mask, completion_mask)
                if packed is None:
                    mask = None if right_padded(attention_mask) else attention_mask.to(self.device)
                    return target_states.final_states_at(model, input_ids.to(self.device), mask, where)
                # The states the targets read, each packed position once (a prompt's last token predicts the first
                # token of every completion of its pack), then gathered in the rows' order.
                read = packed.source.to(self.device)[:, 1:][where]
                if bool((read < 0).any()):
                    raise ValueError("a target token with no state before it (the first token of a row, or padding)")
                lines, width = packed.input_ids.shape
                at = torch.zeros(lines * width, dtype=torch.bool, device=self.device)
                at[read] = True
                rank = at.long().cumsum(0) - 1
                allowed = packed.allowed.to(self.device)
                mask, extra = self._packed_mask(model, packed, allowed)
                states = target_states.final_states_at(model, packed.input_ids.to(self.device), mask,
                                                       at.view(lines, width), packed.position_ids.to(self.device),
                                                       allowed, **extra)
                return states.index_select(0, rank[read])
        hidden = self.hidden(model, input_ids, attention_mask, completion_mask)
        return hidden.states.index_select(0, hidden.source[:, 1:][where])

    def _packed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                completion_mask: torch.Tensor | None) -> Any:
        """The rows' packed lines (PackedRows) when this forward packs them (shared prompts of GRPO rows, or sequence
        packing that saves lines), else None: the rows run as they are."""
        shared = completion_mask is not None and self.shared_prompt
        if not (shared or (self.pack and _packing_saves(attention_mask))):
            return None
        from shop_r1.algo.shared_prompt import pack_rows, pack_shared_prompts, prefix_lengths

        if shared:
            return pack_shared_prompts(input_ids, attention_mask, prefix_lengths(completion_mask, attention_mask),
                                       self.pack)
        return pack_rows(input_ids, attention_mask)

    def _packed_mask(self, model: Any, packed: Any, allowed: torch.Tensor | None = None) -> tuple[Any, dict[str, Any]]:
        """The attention mask packed lines give the model, and the keywords beside it (the split layout). `allowed`:
        `packed.allowed` already on the device, where the caller holds it (not copied again)."""
        dev = self.device
        if self.attention == "flex":
            _flex_ready(model, dev)
            return packed.block_mask(dev), {}
        if self.attention == "split":
            from shop_r1.learner import split_attention

            if split_attention.applies(model):  # else (sliding windows, a wrapper) the dense mask: same outputs
                split_attention.ready(model)
                allowed = packed.allowed.to(dev) if allowed is None else allowed
                return allowed, {split_attention.NAME: split_attention.SplitLayout.of(packed, dev)}
        return packed.additive_mask(model.dtype, dev), {}

    def hidden(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               completion_mask: torch.Tensor | None = None) -> Hidden:
        """One forward of `model`'s transformer over rows [b, T]; packed per prompt when `shared_prompt` and a
        completion mask (GRPO rows) are given, sequence-packed when `pack`, else the rows run as they are."""
        dev = self.device
        packed = self._packed(input_ids, attention_mask, completion_mask)
        if packed is not None:
            mask, extra = self._packed_mask(model, packed)
            hidden = model.model(input_ids=packed.input_ids.to(dev), position_ids=packed.position_ids.to(dev),
                                 attention_mask=mask, **extra).last_hidden_state
            return Hidden(hidden.reshape(-1, hidden.shape[-1]), packed.source.to(dev))
        mask = None if right_padded(attention_mask) else attention_mask.to(dev)
        hidden = model.model(input_ids=input_ids.to(dev), attention_mask=mask).last_hidden_state
        rows, width = input_ids.shape
        source = torch.arange(rows * width, device=dev).view(rows, width) - 1
        source[:, 0] = -1
        return Hidden(hidden.reshape(-1, hidden.shape[-1]), source)

    def target_logprobs(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        target_mask: torch.Tensor, temperature: float = 1.0,
                        completion_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[b, T] logprob of token t (predicted at t - 1) under softmax(logits / temperature) where target_mask[:, t]
        is 1, else 0. The vocabulary projection runs only on target positions (assistant or completion tokens, a
        small share of page-heavy sequences), so no [b, T, V] logits tensor is ever built."""
        return self._target_logprobs_and_logits(model, input_ids, attention_mask, target_mask, temperature,
                                                completion_mask)[0]

    def _target_logprobs_and_logits(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                    target_mask: torch.Tensor, temperature: float = 1.0,
                                    completion_mask: torch.Tensor | None = None
                                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`target_logprobs`, and the LM head's logits [n, V] of the target positions it ran on (unscaled: temperature
        1) with where they are: `where` [b, T-1], the rows' target positions t (predicting token t + 1) in order."""
        ids = input_ids.to(self.device)
        where = target_mask[:, 1:].to(self.device).bool()  # [b, T-1]
        states = self.target_states(model, input_ids, attention_mask, where, completion_mask)
        logits = model.lm_head(states)  # [n, V]
        picked = picked_logprobs(logits, ids[:, 1:][where], temperature)
        out = torch.zeros(ids.shape, dtype=picked.dtype, device=self.device)
        out[:, 1:][where] = picked
        return out, logits, where

    def completion_logprobs(self, model: Any, batch: GRPOBatch) -> torch.Tensor:
        """[b, T] logprob of each completion token under `model` at the batch's sampling temperature (0 elsewhere):
        log softmax(logits / T), the distribution the engine sampled from (as TRL and verl score it)."""
        return self.target_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask,
                                    batch.temperature, completion_mask=batch.completion_mask)

    def completion_logprobs_and_self_certainty(self, model: Any, batch: GRPOBatch,
                                               direction: Literal["p_to_u", "u_to_p"], normalize_by_vocab: bool = False
                                               ) -> tuple[torch.Tensor, list[float]]:
        """`completion_logprobs` (with gradient where enabled) and, from the same forward, `rationale_self_certainty`'s
        values: the rationale tokens are completion tokens, so their logits are rows of the ones the LM head already
        ran on, taken detached and unscaled (s(r) is defined at temperature 1, whatever the batch's). One forward,
        one LM-head call, as `completion_logprobs` alone makes."""
        logp, logits, where = self._target_logprobs_and_logits(
            model, batch.input_ids, batch.attention_mask, batch.completion_mask, batch.temperature,
            completion_mask=batch.completion_mask)
        rationale = batch.rationale_mask[:, 1:].to(self.device).bool()  # [b, T-1]
        if bool((rationale & ~where).any()):
            raise ValueError("a rationale token outside the completion: rationale_mask must mark completion tokens")
        logits = logits.detach()[rationale[where]]  # [n_rationale, V], in row order
        return logp, [self_certainty_from_logits(rows, direction, normalize_by_vocab) if rows.shape[0] else 0.0
                      for rows in logits.split(rationale.sum(dim=1).tolist())]

    @torch.no_grad()
    def rationale_self_certainty(self, model: Any, batch: GRPOBatch, direction: Literal["p_to_u", "u_to_p"],
                                 normalize_by_vocab: bool = False) -> list[float]:
        """s(r) per row (0 without rationale tokens) from `model`'s full logits at temperature 1 over the row's
        rationale tokens: s(r) is defined on the model's own distribution, not the sampling one. One LM-head call
        for all the rows (under ZeRO-3 each call is a collective: every rank makes as many, whatever its rows hold)."""
        where = batch.rationale_mask[:, 1:].to(self.device).bool()  # [b, T-1]
        states = self.target_states(model, batch.input_ids, batch.attention_mask, where, batch.completion_mask)
        logits = model.lm_head(states)  # [n_rationale, V]
        return [self_certainty_from_logits(rows, direction, normalize_by_vocab) if rows.shape[0] else 0.0
                for rows in logits.split(where.sum(dim=1).tolist())]
