"""SFT batching: conversations -> token ids with an assistant-only loss mask -> token-budget micro-batches.

Loss mask: 1 on each assistant turn's content and its end-of-turn token, 0 on the system/user turns and on the
`<|im_start|>assistant\\n` header. Found by rendering the conversation one turn at a time with the model's chat
template (templates are prefix-consistent) and mapping character spans to tokens with offset mappings.
Over `max_seq_len`: first the oldest pages' HTML is replaced by a short placeholder (every assistant target stays),
then, if that is not enough, the oldest user/assistant pairs are dropped (the system prompt stays); a conversation
whose last pair alone does not fit is left out and counted (truncating a JSON target would teach broken JSON).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from shop_r1.data.prompts import apply_chat_template
from shop_r1.types import Message, SFTExample


@dataclass(frozen=True)
class SFTSequence:
    session_id: str
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    num_dropped_turns: int = 0
    num_omitted_pages: int = 0


@dataclass(frozen=True)
class TokenizedSFT:
    sequences: tuple[SFTSequence, ...]
    num_dropped: int
    """Conversations left out because even their last turn pair exceeds max_seq_len."""


@dataclass(frozen=True)
class MicroBatch:
    input_ids: torch.Tensor  # [b, t], right-padded
    attention_mask: torch.Tensor  # [b, t]
    loss_mask: torch.Tensor  # [b, t]: 1 where the token is an assistant target
    num_loss_tokens: int


def _assistant_spans(tokenizer: Any, messages: Sequence[Message]) -> tuple[str, list[tuple[int, int]]]:
    text = apply_chat_template(tokenizer, messages, add_generation_prompt=False)
    eos = tokenizer.eos_token or ""
    spans = []
    for k, m in enumerate(messages):
        if m.role != "assistant":
            continue
        start = len(apply_chat_template(tokenizer, messages[:k], add_generation_prompt=True))
        end = len(apply_chat_template(tokenizer, messages[:k + 1], add_generation_prompt=False))
        cut = text.find(eos, start + len(m.content)) if eos else -1
        spans.append((start, cut + len(eos) if 0 <= cut < end else end))
    return text, spans


def _encode(tokenizer: Any, messages: Sequence[Message], last_only: bool = False) -> tuple[list[int], list[int]]:
    text, spans = _assistant_spans(tokenizer, messages)
    spans = spans[-1:] if last_only else spans
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= lo < e for s, e in spans)) for lo, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


PAGE_OMITTED = "Page HTML omitted to fit the context; the shopper's action on it follows."


def _omit_pages(turns: Sequence[Message], k: int) -> list[Message]:
    """The first k user turns (pages) replaced by a placeholder; the last user turn is never omitted."""
    out, seen = [], 0
    users = sum(m.role == "user" for m in turns)
    for m in turns:
        if m.role == "user" and seen < min(k, users - 1):
            out.append(Message("user", PAGE_OMITTED))
            seen += 1
        else:
            out.append(m)
    return out


def tokenize_sft_example(example: SFTExample, tokenizer: Any, max_seq_len: int) -> SFTSequence | None:
    system, turns = example.messages[:1], list(example.messages[1:])
    num_pages = sum(m.role == "user" for m in turns)
    for k in range(num_pages):  # omit the oldest pages' HTML, one more each time
        ids, mask = _encode(tokenizer, system + tuple(_omit_pages(turns, k)), example.train_last_turn_only)
        if len(ids) <= max_seq_len:
            return SFTSequence(example.session_id, tuple(ids), tuple(mask), num_dropped_turns=0, num_omitted_pages=k)
    turns = _omit_pages(turns, num_pages)
    dropped = 0
    while len(turns) > 2:  # then drop the oldest turn pairs
        turns = turns[2:]
        dropped += 1
        ids, mask = _encode(tokenizer, system + tuple(turns), example.train_last_turn_only)
        if len(ids) <= max_seq_len:
            return SFTSequence(example.session_id, tuple(ids), tuple(mask), dropped, num_pages - 1)
    return None


def tokenize_sft_examples(examples: Sequence[SFTExample], tokenizer: Any, max_seq_len: int) -> TokenizedSFT:
    out = [tokenize_sft_example(e, tokenizer, max_seq_len) for e in examples]
    kept = tuple(s for s in out if s is not None)
    return TokenizedSFT(kept, len(out) - len(kept))


def pack_micro_batches(sequences: Sequence[SFTSequence], max_tokens_per_micro_batch: int,
                       pad_id: int = 0) -> list[MicroBatch]:
    """Longest first; a micro-batch grows while rows x longest <= the budget (one longer sequence goes alone)."""
    order = sorted(sequences, key=lambda s: -len(s.input_ids))
    groups: list[list[SFTSequence]] = []
    for seq in order:
        if groups and (len(groups[-1]) + 1) * len(groups[-1][0].input_ids) <= max_tokens_per_micro_batch:
            groups[-1].append(seq)
        else:
            groups.append([seq])
    return [_collate(g, pad_id) for g in groups]


def _collate(group: Sequence[SFTSequence], pad_id: int) -> MicroBatch:
    t = max(len(s.input_ids) for s in group)
    ids = torch.full((len(group), t), pad_id, dtype=torch.long)
    attn = torch.zeros((len(group), t), dtype=torch.long)
    loss = torch.zeros((len(group), t), dtype=torch.long)
    for i, s in enumerate(group):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        attn[i, :n] = 1
        loss[i, :n] = torch.tensor(s.loss_mask)
    # A token's loss is predicted from the previous position; the first token is never a target.
    loss[:, 0] = 0
    return MicroBatch(ids, attn, loss, int(loss.sum()))


def sft_global_batches(sequences: Sequence[SFTSequence], global_batch_size: int, num_ranks: int, epoch: int,
                       seed: int) -> list[list[list[SFTSequence]]]:
    """Per optimizer step, per rank, its sequences. Shuffled per epoch (seeded); the last partial batch is kept.

    Within a step, sequences go to ranks longest-first to the rank with the fewest tokens so far (balanced work).
    """
    order = list(range(len(sequences)))
    random.Random(seed * 100003 + epoch).shuffle(order)
    steps = []
    for start in range(0, len(order), global_batch_size):
        chunk = sorted((sequences[i] for i in order[start:start + global_batch_size]),
                       key=lambda s: -len(s.input_ids))
        shares: list[list[SFTSequence]] = [[] for _ in range(num_ranks)]
        loads = [0] * num_ranks
        for seq in chunk:
            r = loads.index(min(loads))
            shares[r].append(seq)
            loads[r] += len(seq.input_ids)
        steps.append(shares)
    return steps
