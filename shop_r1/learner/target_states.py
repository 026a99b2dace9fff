"""The final hidden states at target positions only, without running the last decoder layer where nothing reads it.

A loss reads the model's output only at target positions (the assistant answer of an SFT row, ~100 of ~2,000
tokens of a shop page; a GRPO completion). Every layer but the last must run over all positions, since its keys and
values feed the targets through the next layer; the last layer needs its keys and values everywhere, but its query,
attention output, residual, MLP and the final norm only where a target is predicted. This module runs the model's
own modules that way: layers 0..L-2 as the model runs them (the model's own causal mask, SDPA's `is_causal` for
right-padded rows), then for layer L-1 keys/values over all positions and the rest over the targets, with a causal
mask of the targets' rows. The outputs are the full forward's at those positions (same modules, same order of
operations per position; a test checks outputs and gradients). On the main job's 2-layer model an SFT forward +
backward runs 1.77x faster (benchmarks/bench_last_layer.py); on an L-layer model at most 1/L of the work is saved.
GRPO's packed lines (shared prompts, sequence packing) run the same way with their own position ids and block
mask: the targets are the completion tokens and each prompt's last token.

Shapes: b rows, T tokens, m the most targets in a row, n all targets, H hidden size, h / g query / key-value heads,
d head size.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

ARCHITECTURES = ("qwen2", "llama")
"""Decoder layers of these transformers architectures (pre-norm: input_layernorm, self_attn with q/k/v/o_proj and
rotary embeddings, post_attention_layernorm, mlp) are run this way; anything else takes the full forward."""


def supports(model: Any) -> bool:
    """Whether `model` (an HF causal LM) has the layout this module runs: a listed architecture, no sliding-window
    layer, no attention dropout while training, and a last layer that runs when called directly (not an FSDP2 shard,
    whose parameters are gathered only by the layer's own forward; ZeRO-3 gathers per module and is fine)."""
    config, inner = getattr(model, "config", None), getattr(model, "model", None)
    if config is None or getattr(config, "model_type", None) not in ARCHITECTURES:
        return False
    layers = getattr(inner, "layers", None)
    if not layers or not all(hasattr(inner, k) for k in ("embed_tokens", "rotary_emb", "norm")):
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return False
    if model.training and float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
        return False
    if int(getattr(config, "pretraining_tp", 1) or 1) > 1:
        return False
    last = layers[config.num_hidden_layers - 1]
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        FSDPModule = ()  # noqa: N806
    return not isinstance(last, FSDPModule) and hasattr(last, "self_attn") and hasattr(last, "mlp")


def _causal_mask(inner: Any, embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                 position_ids: torch.Tensor) -> Any:
    """The mask the model's own forward gives its layers (None where SDPA can run `is_causal`)."""
    from transformers.masking_utils import create_causal_mask

    return create_causal_mask(config=inner.config, inputs_embeds=embeds, attention_mask=attention_mask,
                              past_key_values=None, position_ids=position_ids)


def _target_index(where: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """where [b, T'] (True at a target position) -> index [b, m] of each row's target positions in order (0 in
    the unused slots) and valid [b, m]."""
    counts = where.sum(dim=1)
    m = int(counts.max()) if where.numel() else 0
    rows, cols = where.nonzero(as_tuple=True)
    rank = where.long().cumsum(dim=1)[rows, cols] - 1
    index = torch.zeros((where.shape[0], m), dtype=torch.long, device=where.device)
    index[rows, rank] = cols
    valid = torch.arange(m, device=where.device)[None, :] < counts[:, None]
    return index, valid


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [b, T, k] at index [b, m] -> [b, m, k]."""
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))


def final_states_at(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    where: torch.Tensor, position_ids: torch.Tensor | None = None,
                    allowed: torch.Tensor | None = None, **layer_kwargs: Any) -> torch.Tensor:
    """The model's final hidden states (after the last norm) at the positions `where` [b, T'] marks (T' <= T), as
    [n, H] in row-major order: the rows of `model.model(...).last_hidden_state[where]`. `attention_mask` is what the
    model's forward would take (None for right-padded rows, or the [b, T] padding mask).

    Packed lines (shop_r1/algo/shared_prompt.py) pass their `position_ids` [b, T], their 4D mask as `attention_mask`
    (the dense additive one, or `allowed` itself under learner.attention=split, whose layout comes in
    `layer_kwargs`), and `allowed` [b, 1, T, T] bool: the last layer's targets then see exactly the keys their rows
    of `allowed` allow."""
    inner, config = model.model, model.config
    b, width = input_ids.shape
    where = torch.nn.functional.pad(where.bool(), (0, width - where.shape[1]))
    embeds = inner.embed_tokens(input_ids)
    if position_ids is None:
        position_ids = torch.arange(width, device=input_ids.device)[None, :]
    cos, sin = inner.rotary_emb(embeds, position_ids)  # [1 or b, T, d] each
    mask = _causal_mask(inner, embeds, attention_mask, position_ids)
    layers = inner.layers[:config.num_hidden_layers]
    hidden = embeds
    for layer in layers[:-1]:
        hidden = layer(hidden, attention_mask=mask, position_embeddings=(cos, sin), position_ids=position_ids,
                       **layer_kwargs)

    last = layers[-1]
    attn = last.self_attn
    rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
    index, valid = _target_index(where)  # [b, m]
    d = attn.head_dim
    heads, kv_heads = attn.q_proj.out_features // d, attn.k_proj.out_features // d
    normed = last.input_layernorm(hidden)  # [b, T, H]
    keys = attn.k_proj(normed).view(b, width, kv_heads, d).transpose(1, 2)  # [b, g, T, d]
    values = attn.v_proj(normed).view(b, width, kv_heads, d).transpose(1, 2)
    _, keys = rotary(keys, keys, cos, sin)
    m = index.shape[1]  # 0 when no row has a target (an idle rank's empty micro-batch): every module still runs
    queries = attn.q_proj(_take(normed, index)).view(b, m, heads, d).transpose(1, 2)  # [b, h, m, d]
    cos_t, sin_t = (_take(t.expand(b, -1, -1), index) for t in (cos, sin))
    queries, _ = rotary(queries, queries, cos_t, sin_t)
    repeat = heads // kv_heads
    keys, values = keys.repeat_interleave(repeat, dim=1), values.repeat_interleave(repeat, dim=1)
    if allowed is not None:  # packed lines: the targets' rows of the layout's mask
        visible = allowed[:, 0].gather(1, index[..., None].expand(-1, -1, width))  # [b, m, T]
    else:
        visible = torch.arange(width, device=index.device)[None, None, :] <= index[..., None]  # [b, m, T]
        if attention_mask is not None:
            visible = visible & attention_mask.bool()[:, None, :]
    visible = visible | ~valid[..., None]  # unused slots see everything (their outputs are dropped)
    out = torch.nn.functional.scaled_dot_product_attention(queries, keys, values, attn_mask=visible[:, None],
                                                           scale=attn.scaling)
    out = attn.o_proj(out.transpose(1, 2).reshape(b, m, heads * d))
    states = _take(hidden, index) + out
    states = states + last.mlp(last.post_attention_layernorm(states))
    return inner.norm(states)[valid]
