"""Sequence packing: the learner's micro-batch laid out without padding to its longest row.

Right-padded rows of uneven lengths cost rows x longest positions in every layer. Packed, several rows (or
shared-prompt packs, shop_r1/algo/shared_prompt.py) sit end to end in one line as wide as the longest of them:

    line 0 = row 3 (900 tokens) | row 0 (600) | row 5 (450)      width 2000 = the longest row
    line 1 = row 1 (2000)
    position ids   restart at 0 for every row (a shared prompt's completions restart at the prompt's length);
    attention      block-diagonal: each row attends causally within itself only (a pack keeps its own mask).

Every token sees the keys, values and positions it sees in its own row, so logprobs, loss and gradients equal the
padded forward's up to floating-point summation order (tests/algo/test_sequence_packing_on_cpu.py). Lines are as
wide as the longest row, so a dense-mask attention never computes more pairs than the padded rows did (lines x W^2
<= rows x W^2) while the rest of each layer computes lines x W positions instead of rows x W.
"""

from __future__ import annotations

from collections.abc import Sequence


def first_fit_decreasing(sizes: Sequence[int], width: int) -> list[list[int]]:
    """Indices of `sizes` grouped into lines of at most `width` (each size <= width): longest first, each into the
    first line it fits. Within a line, indices keep that order; lines in order of opening."""
    lines: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if sizes[i] > width:
            raise ValueError(f"a sequence of {sizes[i]} tokens does not fit a line of {width}")
        line = next((j for j, r in enumerate(room) if sizes[i] <= r), None)
        if line is None:
            lines.append([])
            room.append(width)
            line = len(lines) - 1
        lines[line].append(i)
        room[line] -= sizes[i]
    return lines
