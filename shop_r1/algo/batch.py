"""Scored rollouts -> the learner's batch: prompt+completion token rows, which positions are trained, advantages.

Shapes: B = P * G responses, T = the longest prompt + completion. Row b holds prompt_b followed by completion_b,
right-padded. `completion_mask[b, t] = 1` when token t of row b is a completion token (so logits at t-1 predict it);
`rationale_mask` marks the completion tokens that belong to the rationale (for the exact self-certainty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from shop_r1.algo.packing import first_fit_decreasing
from shop_r1.reward.self_certainty import rationale_token_mask
from shop_r1.types import ScoredGeneration


@dataclass(frozen=True)
class GRPOBatch:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    completion_mask: torch.Tensor  # [B, T]
    rationale_mask: torch.Tensor  # [B, T]
    advantages: torch.Tensor  # [B] float64
    sampler_logprobs: torch.Tensor  # [B, T], the engine's logprobs on completion tokens (0 elsewhere)
    temperature: float = 1.0
    """The sampling temperature: the learner scores log softmax(logits / temperature), the sampler's distribution
    (1.0 for greedy samples, whose engine logprobs are the temperature-1 ones)."""

    @property
    def num_responses(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_trained_responses(self) -> int:
        """Rows with at least one completion token (an empty padding row trains nothing)."""
        return int((self.completion_mask.sum(dim=1) > 0).sum())

    def select(self, rows: Sequence[int]) -> GRPOBatch:
        idx = torch.tensor(list(rows), dtype=torch.long)
        return GRPOBatch(*(t.index_select(0, idx) for t in (self.input_ids, self.attention_mask, self.completion_mask,
                                                          self.rationale_mask, self.advantages,
                                                          self.sampler_logprobs)), temperature=self.temperature)

    def outside_rationale(self) -> GRPOBatch:
        """The same rows with only the completion tokens outside the rationale left to train (rl.loss_tokens=action):
        the action's JSON and the scaffolding; the rationale's tokens stay in `rationale_mask`."""
        keep = self.completion_mask * (1 - self.rationale_mask.to(self.completion_mask.dtype))
        return dataclasses.replace(self, completion_mask=keep)

    def with_advantages(self, advantages: torch.Tensor) -> GRPOBatch:
        """The same rows with these advantages: one per row in row order, any shape (e.g. [P, G]), kept in float64."""
        flat = advantages.reshape(-1).to(torch.float64).clone()
        if flat.numel() != self.num_responses:
            raise ValueError(f"{flat.numel()} advantages for {self.num_responses} responses")
        return dataclasses.replace(self, advantages=flat)

    def trimmed(self) -> GRPOBatch:
        """The same rows cut to the longest of them (rows are right-padded, so nothing real is cut)."""
        width = max(2, int(self.attention_mask.sum(dim=1).max())) if self.num_responses else 2
        if width >= self.input_ids.shape[1]:
            return self
        return GRPOBatch(*(t[:, :width] for t in (self.input_ids, self.attention_mask, self.completion_mask,
                                                   self.rationale_mask)), self.advantages,
                         self.sampler_logprobs[:, :width], temperature=self.temperature)

    def empty_like(self, rows: int = 1) -> GRPOBatch:
        """`rows` two-token rows that train nothing (all masks 0): what a rank with no share of the batch runs so that
        it still joins every collective forward and backward."""
        ids = torch.zeros((rows, 2), dtype=torch.long)
        zeros = torch.zeros_like(ids)
        return GRPOBatch(ids, torch.ones_like(ids), zeros, zeros, torch.zeros(rows, dtype=self.advantages.dtype),
                         torch.zeros((rows, 2), dtype=self.sampler_logprobs.dtype), temperature=self.temperature)


def micro_batch_rows(lengths: Sequence[int], budget: int, prompts: Sequence[tuple[int, Hashable]] | None = None,
                     pack: bool = False) -> list[list[int]]:
    """Consecutive rows split into micro-batches whose padded cost stays within `budget` tokens (a row that alone
    exceeds it is a micro-batch of its own).

    Without `prompts` a micro-batch costs rows x its longest row. With them (shared-prompt packing; prompts[b] =
    (prompt length, a key equal for rows with the same prompt)) it costs packs x its longest pack, a pack being the
    prompt once plus every completion that continues it. With `pack` (sequence packing, shop_r1/algo/packing.py)
    the rows or packs are laid end to end: it costs lines x its longest, first fit decreasing.
    """
    out: list[list[int]] = []
    current: list[int] = []
    packs: dict[Hashable, int] = {}  # key -> pack length so far

    def grown(b: int) -> dict[Hashable, int]:
        length, key = prompts[b]
        return {**packs, key: packs.get(key, length) + lengths[b] - length}

    def cost_with(b: int) -> int:
        sizes = [lengths[r] for r in [*current, b]] if prompts is None else list(grown(b).values())
        if pack:
            return len(first_fit_decreasing(sizes, max(sizes))) * max(sizes)
        return len(sizes) * max(sizes)

    for b in range(len(lengths)):
        if current and cost_with(b) > budget:
            out.append(current)
            current, packs = [], {}
        if prompts is not None:
            packs = grown(b)
        current.append(b)
    if current:
        out.append(current)
    return out


def build_grpo_batch(scored: Sequence[ScoredGeneration], advantages: torch.Tensor, pad_id: int,
                     temperature: float = 1.0) -> GRPOBatch:
    """advantages: [P, G] aligned with scored[p].generation.completions[g]; `temperature`: the one they were sampled
    at (0, greedy, is scored at 1)."""
    rows, comp, rat, adv, lps = [], [], [], [], []
    for p, s in enumerate(scored):
        prompt = list(s.generation.prompt_token_ids)
        for g, (c, reward) in enumerate(zip(s.generation.completions, s.rewards)):
            rows.append(prompt + list(c.token_ids))
            comp.append([0] * len(prompt) + [1] * len(c.token_ids))
            parsed = reward.parsed  # parsed once, by the reward stage
            in_rationale = rationale_token_mask(c.token_offsets, len(c.text), parsed.rationale_span) \
                if parsed is not None else [False] * len(c.token_ids)
            rat.append([0] * len(prompt) + [int(x) for x in in_rationale])
            adv.append(float(advantages[p, g]))
            lps.append([0.0] * len(prompt) + list(c.logprobs))
    width = max(len(r) for r in rows)

    def pad(seqs: list[list], value: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([list(s) + [value] * (width - len(s)) for s in seqs], dtype=dtype)

    return GRPOBatch(
        input_ids=pad(rows, pad_id, torch.long),
        attention_mask=pad([[1] * len(r) for r in rows], 0, torch.long),
        completion_mask=pad(comp, 0, torch.long),
        rationale_mask=pad(rat, 0, torch.long),
        advantages=torch.tensor(adv, dtype=torch.float64),
        sampler_logprobs=pad(lps, 0.0, torch.float32),
        temperature=temperature if temperature > 0 else 1.0,
    )
