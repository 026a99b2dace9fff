"""Scored rollouts -> the learner's batch: prompt+completion token rows, which positions are trained, advantages.

Shapes: B = P * G responses, T = the longest prompt + completion. Row b holds prompt_b followed by completion_b,
right-padded. `completion_mask[b, t] = 1` when token t of row b is a completion token (so logits at t-1 predict it);
`rationale_mask` marks the completion tokens that belong to the rationale (for the exact self-certainty).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from shop_r1.reward.format import parse_response
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

    def select(self, rows: Sequence[int]) -> "GRPOBatch":
        idx = torch.tensor(list(rows), dtype=torch.long)
        return GRPOBatch(*(t.index_select(0, idx) for t in (self.input_ids, self.attention_mask, self.completion_mask,
                                                          self.rationale_mask, self.advantages,
                                                          self.sampler_logprobs)), temperature=self.temperature)

    def empty_like(self, rows: int = 1) -> "GRPOBatch":
        """`rows` two-token rows that train nothing (all masks 0): what a rank with no share of the batch runs so that
        it still joins every collective forward and backward."""
        ids = torch.zeros((rows, 2), dtype=torch.long)
        zeros = torch.zeros_like(ids)
        return GRPOBatch(ids, torch.ones_like(ids), zeros, zeros, torch.zeros(rows, dtype=self.advantages.dtype),
                         torch.zeros((rows, 2), dtype=self.sampler_logprobs.dtype), temperature=self.temperature)


def build_grpo_batch(scored: Sequence[ScoredGeneration], advantages: torch.Tensor, pad_id: int,
                     temperature: float = 1.0) -> GRPOBatch:
    """advantages: [P, G] aligned with scored[p].generation.completions[g]; `temperature`: the one they were sampled
    at (0, greedy, is scored at 1)."""
    rows, comp, rat, adv, lps = [], [], [], [], []
    for p, s in enumerate(scored):
        prompt = list(s.generation.prompt_token_ids)
        for g, c in enumerate(s.generation.completions):
            rows.append(prompt + list(c.token_ids))
            comp.append([0] * len(prompt) + [1] * len(c.token_ids))
            parsed = parse_response(c.text)
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
