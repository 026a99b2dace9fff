"""Which prompts each RL step takes: a seeded shuffle per epoch and a cursor that checkpoints can restore."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Cursor:
    epoch: int = 0
    position: int = 0


class PromptSampler:
    """Yields batches of prompt indices; the same (seed, cursor) always gives the same next batch."""

    def __init__(self, num_prompts: int, batch_size: int, seed: int, cursor: Cursor = Cursor()) -> None:
        if num_prompts < 1 or batch_size < 1:
            raise ValueError(f"need prompts and a batch size >= 1 (got {num_prompts}, {batch_size})")
        self.num_prompts, self.batch_size, self.seed = num_prompts, batch_size, seed
        self.cursor = cursor

    def _order(self, epoch: int) -> list[int]:
        order = list(range(self.num_prompts))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[int]:
        out: list[int] = []
        epoch, pos = self.cursor.epoch, self.cursor.position
        while len(out) < self.batch_size:
            order = self._order(epoch)
            take = order[pos:pos + self.batch_size - len(out)]
            out.extend(take)
            pos += len(take)
            if pos >= self.num_prompts:
                epoch, pos = epoch + 1, 0
        self.cursor = Cursor(epoch, pos)
        return out
