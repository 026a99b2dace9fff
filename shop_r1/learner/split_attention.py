"""learner.attention=split: shared-prompt lines attended piece by piece, so no masked pair is computed.

A packed line (shop_r1/algo/shared_prompt.py) holds packs `prompt | completion_1 | ... | completion_k`, several per
line with sequence packing, then padding. The dense path gives SDPA the [W, W] mask: every pair of the line is
computed, then masked. Here each pack is two SDPA calls (the Prefix Grouper split, arXiv 2506.05433):

    the prompt's queries       against the prompt's keys, `is_causal` (the kernel skips the blocks above the diagonal);
    the completions' queries   against the pack's keys (prompt + completions), with the small [C, p + C] mask that
                               lets completion j see the prompt and its own earlier tokens only.

The pairs computed per pack are about p^2 / 2 + C (p + C) instead of W^2 (p prompt tokens, C completion tokens of
the pack, W the line's width), and no query sees a key the dense mask hides, so the outputs and gradients are the
dense path's up to summation order. Padding queries (after the line's last pack) get zeros: nothing reads them.
Works wherever SDPA does (CPU, CUDA: the prompt's causal call can run a flash kernel, which the dense 4D mask rules
out); the pieces are plain autograd ops, so gradient checkpointing and ZeRO see ordinary modules.

It plugs into transformers' attention interface: `ready(model)` switches the model to `shop_r1_split`, registered
with SDPA's mask function, so a forward without a layout is exactly SDPA's; `Forward.hidden` passes the layout as
the `shop_r1_split` keyword, which transformers hands to every attention call, beside the dense mask (a 4D mask is
passed through untouched, and would be used if the keyword were ever dropped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shop_r1.algo.shared_prompt import PackedRows

NAME = "shop_r1_split"


@dataclass(frozen=True)
class Pack:
    start: int  # the pack's first token in its line
    prompt: int  # its prompt's length (a row without completions: its whole length)
    end: int  # one past its last token
    completion_mask: torch.Tensor | None  # [1, 1, end - start - prompt, end - start] bool, None without completions


@dataclass(frozen=True)
class SplitLayout:
    lines: tuple[tuple[Pack, ...], ...]  # per line, its packs in order
    width: int

    @classmethod
    def of(cls, packed: PackedRows, device: torch.device | str) -> SplitLayout:
        """The packs of every line, read from `packed.segments` and `packed.blocks` (built once per forward, shared
        by every layer)."""
        segments, blocks = packed.segments.tolist(), packed.blocks.tolist()
        lines = []
        for seg, blk in zip(segments, blocks):
            packs, at, width = [], 0, len(seg)
            while at < width and blk[at] >= 0:
                end = at
                while end < width and blk[end] == blk[at]:
                    end += 1
                prompt = at
                while prompt < end and seg[prompt] == 0:
                    prompt += 1
                packs.append(Pack(at, prompt - at, end, _completion_mask(seg[at:end], prompt - at, device)))
                at = end
            lines.append(tuple(packs))
        return cls(tuple(lines), len(segments[0]) if segments else 0)


def _completion_mask(seg: list[int], prompt: int, device: torch.device | str) -> torch.Tensor | None:
    """[1, 1, C, prompt + C]: completion query i sees every prompt key and the keys of its own completion up to
    itself (the same entries as the dense mask's rows)."""
    if len(seg) == prompt:
        return None
    s = torch.tensor(seg, device=device)
    q, k = s[prompt:].unsqueeze(1), s.unsqueeze(0)  # [C, 1], [1, p + C]
    qi = torch.arange(prompt, len(seg), device=device).unsqueeze(1)
    ki = torch.arange(len(seg), device=device).unsqueeze(0)
    return ((k == 0) | ((k == q) & (ki <= qi))).view(1, 1, len(seg) - prompt, len(seg))


def split_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature (query [n, h, W, d], key/value [n, h_kv, W, d]) -> ([n, W, h, d], None).
    With a `shop_r1_split` layout: the pieces above; without one: transformers' SDPA, unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout: SplitLayout | None = kwargs.pop(NAME, None)
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kwargs.pop("is_causal", None)  # each piece says its own
    if query.shape[0] != len(layout.lines) or query.shape[2] != layout.width:
        raise ValueError(f"learner.attention=split: the layout has {len(layout.lines)} lines of {layout.width} "
                         f"tokens, the attention call {query.shape[0]} of {query.shape[2]}")

    def sdpa(i: int, q: slice, k: slice, mask: torch.Tensor | None) -> torch.Tensor:
        return sdpa_attention_forward(module, query[i:i + 1, :, q], key[i:i + 1, :, k], value[i:i + 1, :, k], mask,
                                      dropout=dropout, scaling=scaling, is_causal=mask is None, **kwargs)[0]

    out = []
    for i, packs in enumerate(layout.lines):
        pieces = []
        for p in packs:
            mid = p.start + p.prompt
            pieces.append(sdpa(i, slice(p.start, mid), slice(p.start, mid), None))
            if p.completion_mask is not None:
                pieces.append(sdpa(i, slice(mid, p.end), slice(p.start, p.end), p.completion_mask))
        tail = layout.width - (packs[-1].end if packs else 0)
        if tail:
            pieces.append(query.new_zeros(1, tail, query.shape[1], value.shape[-1]))
        out.append(torch.cat(pieces, dim=1))
    return torch.cat(out, dim=0), None


def register() -> None:
    """Register `shop_r1_split` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, split_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def _refusal(model: Any) -> str:
    """Why `model` cannot run the split pieces, or "" where it can: already switched (a wrapper's view of a model
    switched before it was wrapped), or a transformers model that can be switched and has no sliding-window layer."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == NAME:
        return ""
    if config is None or not hasattr(model, "set_attn_implementation"):
        return (f"learner.attention=split needs a transformers model to switch its attention, got "
                f"{type(model).__name__}; use learner.attention=dense with this backend")
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return ("learner.attention=split does not apply sliding windows (this model has sliding-attention layers); "
                "use learner.attention=dense")
    return ""


def applies(model: Any) -> bool:
    """Whether `model` can run the split pieces (`_refusal`). Elsewhere the learner's forward passes the dense mask
    instead (the documented fallback of learner.attention=split)."""
    return not _refusal(model)


def ready(model: Any) -> None:
    """Switch `model` (a transformers model) to `shop_r1_split`, once; loud where it cannot be switched. A view of a
    model switched before it was wrapped (learner.backend=fsdp2's policy) only registers the function in this
    process."""
    why = _refusal(model)
    if why:
        raise ValueError(why)
    register()
    if model.config._attn_implementation != NAME:
        model.set_attn_implementation(NAME)
