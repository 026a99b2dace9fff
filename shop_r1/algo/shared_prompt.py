"""Shared-prompt packing: the G completions of a group share one prompt, so encode that prompt once.

A GRPO batch holds rows `prompt_b + completion_b`; the G rows of a group repeat the same prompt (often 10x longer than
a completion). Packing lays each distinct prompt out once, followed by every completion that continues it, in one
sequence with a block attention mask (the Prefix Grouper idea, arXiv 2506.05433):

    pack   = prompt | completion_1 | completion_2 | ... | completion_k
    query in the prompt        attends causally to the prompt;
    query in completion_j      attends to the whole prompt and causally to completion_j, never to another completion;
    position ids               restart at len(prompt) for every completion (each one sees the positions it had alone).

Every completion token then sees exactly the keys, values and positions it sees in its own unpacked row, so its hidden
state, logits and logprob are the same up to floating-point summation order, and so is the gradient: the prompt's
activations are shared, and backpropagation sums their G contributions, as the G separate rows would. `source[b, t]`
maps each row position back to the packed hidden state that predicts it (the state at row position t - 1), so callers
keep working in the row layout: losses, masks and advantages do not change.

With `pack` (sequence packing, shop_r1/algo/packing.py) several packs share one line, each attending only within
itself; `pack_rows` does the same for rows that share nothing.

`PackedRows.block_mask` gives the same mask as a FlexAttention `BlockMask` (learner.attention=flex): the masked
blocks are skipped instead of computed, and CUDA runs a fused kernel rather than SDPA's masked one.

Pure torch, no model: tested against the unpacked rows by hand and with a real model in tests/algo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


@dataclass(frozen=True)
class PackedRows:
    input_ids: torch.Tensor  # [n, W] lines of packed sequences, right-padded with token 0
    position_ids: torch.Tensor  # [n, W]
    allowed: torch.Tensor  # [n, 1, W, W] bool: query i may attend to key k
    source: torch.Tensor  # [b, T] flat index into [n * W] of the hidden state predicting row token t (-1: none)
    segments: torch.Tensor  # [n, W]: 0 prompt, j > 0 the pack's j-th completion, -1 padding
    blocks: torch.Tensor  # [n, W]: the pack each token belongs to (several per line when packed), -1 padding

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the packs: what a forward over them costs."""
        return int((self.segments >= 0).sum())

    @property
    def num_positions(self) -> int:
        """Positions the forward computes, padding included: lines x width."""
        return int(self.segments.numel())

    def additive_mask(self, dtype: torch.dtype, device: torch.device | str | None = None) -> torch.Tensor:
        """The mask as eager and SDPA attention both take it: 0 where allowed, the dtype's minimum elsewhere. Built
        on `device` (the bool mask travels, not the wider additive one)."""
        allowed = self.allowed.to(device) if device is not None else self.allowed
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return mask.masked_fill_(~allowed, torch.finfo(dtype).min)

    def block_mask(self, device: torch.device | str) -> BlockMask:
        """The same mask as `allowed`, as FlexAttention's block-sparse `BlockMask` (built on `device` from the
        segments and packs, never from the [n, 1, W, W] tensor): key blocks a query block cannot see are skipped,
        not computed and masked, so a completion's cost is its prompt and itself, not the whole line. Exactly
        `allowed` at every (query, key): causal in the layout, never across packs or between two completions,
        padding queries seeing themselves only."""
        from torch.nn.attention.flex_attention import create_block_mask

        seg, blk = self.segments.to(device), self.blocks.to(device)

        def mask_mod(b, h, q, k):  # FlexAttention calls it per (line, head, query, key); no head depends
            sq, sk = seg[b, q], seg[b, k]
            inside = (k <= q) & (sq >= 0) & (sk >= 0) & ((sk == 0) | (sk == sq)) & (blk[b, q] == blk[b, k])
            return inside | (q == k)

        lines, width = seg.shape
        # Compiled on CUDA (transformers does the same): uncompiled, the mask is evaluated as [n, W, W] index tensors.
        # torch 2.11 warns that `_compile` will go (in favour of torch.compile(create_block_mask)); it still works.
        return create_block_mask(mask_mod, lines, None, width, width, device=device,
                                 _compile=torch.device(device).type == "cuda")


def prefix_lengths(completion_mask: torch.Tensor, attention_mask: torch.Tensor) -> list[int]:
    """Per row, the index of its first completion token (its whole length when it has none)."""
    lengths = attention_mask.sum(dim=1).tolist()
    out = []
    for b, row in enumerate(completion_mask.tolist()):
        out.append(row.index(1) if 1 in row else int(lengths[b]))
    return out


def pack_shared_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, prefixes: list[int],
                        pack: bool = False) -> PackedRows:
    """Pack right-padded rows [b, T] whose first `prefixes[b]` tokens are their prompt: rows with identical prompts
    share one pack (in order of first appearance), each row's remaining tokens a segment of it. With `pack` the packs
    are laid end to end into as few lines as the longest pack allows (sequence packing, shop_r1/algo/packing.py)."""
    ids = input_ids.tolist()
    packs: dict[tuple[int, ...], int] = {}
    members: list[list[int]] = []
    for b in range(input_ids.shape[0]):
        key = tuple(ids[b][:prefixes[b]])
        if key not in packs:
            packs[key] = len(members)
            members.append([])
        members[packs[key]].append(b)
    return _lay_out(input_ids, attention_mask, prefixes, members, pack)


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedRows:
    """Sequence packing without sharing: right-padded rows [b, T] laid end to end into as few lines as the longest
    row allows, each row a causal block of its own (its whole length one segment 0, positions from 0)."""
    lengths = [int(n) for n in attention_mask.sum(dim=1).tolist()]
    return _lay_out(input_ids, attention_mask, lengths, [[b] for b in range(len(lengths))], pack=True)


def _lay_out(input_ids: torch.Tensor, attention_mask: torch.Tensor, prefixes: list[int],
             members: list[list[int]], pack: bool) -> PackedRows:
    """members[n]: the rows of pack n, which share their first prefixes[b] tokens. One pack per line, or, with
    `pack`, first-fit-decreasing lines as wide as the longest pack (a pack's tokens never see another pack's)."""
    from shop_r1.algo.packing import first_fit_decreasing

    rows, width_in = input_ids.shape
    lengths = [int(n) for n in attention_mask.sum(dim=1).tolist()]
    ids = input_ids.tolist()
    seqs, positions, segments = [], [], []
    offset = [0] * rows  # where row b's segment starts in its pack
    pack_of = [0] * rows
    for n, group in enumerate(members):
        p = prefixes[group[0]]
        seq, pos, seg = list(ids[group[0]][:p]), list(range(p)), [0] * p
        for j, b in enumerate(group, start=1):
            offset[b], pack_of[b] = len(seq), n
            seq += ids[b][p:lengths[b]]
            pos += list(range(p, lengths[b]))
            seg += [j] * (lengths[b] - p)
        seqs.append(seq)
        positions.append(pos)
        segments.append(seg)
    width = max(len(s) for s in seqs)
    lines = first_fit_decreasing([len(s) for s in seqs], width) if pack else [[n] for n in range(len(seqs))]
    start = [0] * len(seqs)  # flat index of pack n's first token in the [lines, W] layout
    line_ids, line_pos, line_seg, line_blk = [], [], [], []
    for i, line in enumerate(lines):
        at = 0
        for n in line:
            start[n], at = i * width + at, at + len(seqs[n])
        line_ids.append([x for n in line for x in seqs[n]])
        line_pos.append([x for n in line for x in positions[n]])
        line_seg.append([x for n in line for x in segments[n]])
        line_blk.append([n for n in line for _ in seqs[n]])
    pad = lambda xs, v: torch.tensor([x + [v] * (width - len(x)) for x in xs], dtype=torch.long)  # noqa: E731
    seg_t, blk_t = pad(line_seg, -1), pad(line_blk, -1)
    q, k = seg_t.unsqueeze(2), seg_t.unsqueeze(1)  # [n, W, 1], [n, 1, W]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    allowed = causal & (k >= 0) & (q >= 0) & ((k == 0) | (k == q))
    if pack:  # block-diagonal: each pack attends only within itself
        allowed &= blk_t.unsqueeze(2) == blk_t.unsqueeze(1)
    allowed |= torch.eye(width, dtype=torch.bool)  # padding queries see themselves only: no empty softmax row
    # Row b's token t (1 <= t < its length) is predicted by the state of its token t - 1: in the prompt at the same
    # index, in the completion at offset[b] + (t - 1 - p). Built with tensor ops (a per-token loop costs more than
    # a GPU forward).
    col = lambda xs: torch.tensor(xs, dtype=torch.long).unsqueeze(1)  # noqa: E731
    p_b, len_b, off_b = col(prefixes), col(lengths), col(offset)
    base_b = col([start[n] for n in pack_of])
    prev = torch.arange(width_in, dtype=torch.long).unsqueeze(0) - 1  # [1, T]
    source = base_b + torch.where(prev < p_b, prev, off_b + prev - p_b)
    source = source.masked_fill((prev < 0) | (prev + 1 >= len_b), -1)
    return PackedRows(pad(line_ids, 0), pad(line_pos, 0), allowed.unsqueeze(1), source, seg_t, blk_t)
