"""Self-certainty s(r) of the rationale: the mean over its tokens of KL(p_j || U), U uniform over the vocabulary.

    KL(p || U) = sum_i p_i log p_i + log V                     (paper Eq. 3, per position, before its 1/|V|)
    KL(U || p) = -log V - (1/V) sum_i log p_i                  (the self-certainty papers' direction; exact only)

Sources:
- exact, from full logits [T, V] (the learner has them);
- estimated, from the top-k logprobs an engine returns: the k known probabilities count exactly and the unseen mass
  m = 1 - sum p is spread evenly over the other V - k tokens. Spreading evenly minimises sum p log p for a fixed
  mass, so the estimate is a lower bound of the exact KL(p || U), equal to it when k = V.
Eq. 3 also divides by |V|, which makes alpha * s <= 4e-7 for real vocabularies (a term with no effect); that
division is off by default and on with `normalize_by_vocab`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shop_r1.config import RewardConfig, SelfCertaintyConfig
from shop_r1.types import TokenLogprobs

if TYPE_CHECKING:  # the reward layer is pure Python; only the learner's exact path below needs torch
    import torch


def check_reward_config(cfg: RewardConfig) -> None:
    """Reject settings that cannot be computed, once, at start-up rather than per response."""
    sc = cfg.self_certainty
    if sc.direction == "u_to_p" and sc.source == "topk_logprobs":
        raise ValueError("reward.self_certainty.direction=u_to_p needs every token's probability: set "
                         "reward.self_certainty.source=learner_logits (top-k logprobs only give KL(p||U) bounds)")


def kl_to_uniform_topk(topk_logprobs: Sequence[Sequence[float]], vocab_size: int) -> list[float]:
    """Per position: the lower-bound estimate of KL(p || U) from the logprobs of k distinct tokens."""
    log_v = math.log(vocab_size)
    out = []
    for row in topk_logprobs:
        known = 0.0
        mass = 0.0
        for lp in row:
            p = math.exp(lp)
            mass += p
            known += p * lp
        unseen = max(0.0, 1.0 - mass)
        rest = vocab_size - len(row)
        if unseen > 0.0 and rest > 0:
            known += unseen * math.log(unseen / rest)
        out.append(known + log_v)
    return out


def kl_to_uniform_logits(logits: torch.Tensor, direction: str = "p_to_u", chunk_size: int = 256) -> torch.Tensor:
    """Exact per-position KL from logits [T, V] -> [T], computed in float64 a chunk of positions at a time."""
    import torch

    if direction not in ("p_to_u", "u_to_p"):
        raise ValueError(f"direction must be p_to_u or u_to_p, got {direction!r}")
    vocab = logits.shape[-1]
    log_v = math.log(vocab)
    out = []
    for chunk in logits.split(chunk_size, dim=0):
        logp = torch.log_softmax(chunk.to(torch.float64), dim=-1)
        if direction == "p_to_u":
            out.append((logp.exp() * logp).sum(dim=-1) + log_v)
        else:
            out.append(-log_v - logp.mean(dim=-1))
    return torch.cat(out).to(logits.dtype if logits.is_floating_point() else torch.float32)


def rationale_token_mask(token_offsets: Sequence[int], text_len: int, span: tuple[int, int]) -> list[bool]:
    """Token j covers [offsets[j], offsets[j+1]) (the last ends at text_len); True if it overlaps `span`."""
    start, end = span
    mask = []
    for j, lo in enumerate(token_offsets):
        hi = token_offsets[j + 1] if j + 1 < len(token_offsets) else text_len
        mask.append(lo < end and hi > start and start < end)
    return mask


def mean_over_mask(values: Sequence[float], mask: Sequence[bool]) -> float:
    picked = [v for v, m in zip(values, mask) if m]
    return sum(picked) / len(picked) if picked else 0.0


def self_certainty(logprobs: TokenLogprobs, span: tuple[int, int], text_len: int, cfg: SelfCertaintyConfig) -> float:
    """s(r) from an engine's top-k logprobs: the mean estimated KL(p || U) over the rationale's tokens (0 if none)."""
    if len(logprobs.topk_logprobs) != len(logprobs.token_offsets):
        raise ValueError(f"{len(logprobs.topk_logprobs)} logprob rows for {len(logprobs.token_offsets)} tokens")
    mask = rationale_token_mask(logprobs.token_offsets, text_len, span)
    rows = [row for row, m in zip(logprobs.topk_logprobs, mask) if m]
    if not rows:
        return 0.0
    values = kl_to_uniform_topk(rows, logprobs.vocab_size)
    s = sum(values) / len(values)
    return s / logprobs.vocab_size if cfg.normalize_by_vocab else s
