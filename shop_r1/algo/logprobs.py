"""Logprobs of given tokens from logits, a chunk of rows at a time (no second [B, T, V] float32 tensor kept)."""

from __future__ import annotations

import torch


def token_logprobs_from_logits(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0,
                               chunk_rows: int = 4) -> torch.Tensor:
    """logits [B, T, V], token_ids [B, T] -> [B, T]: log softmax(logits / temperature)[token]."""
    out = []
    for lg, ids in zip(logits.split(chunk_rows, dim=0), token_ids.split(chunk_rows, dim=0)):
        lg = lg.float() if temperature == 1.0 else lg.float() / temperature
        out.append(lg.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(lg, dim=-1))
    return torch.cat(out, dim=0)
