"""Headroom: what a model's own samples already get right that its greedy answer does not (issue 45).

For each held-out example, the greedy answer and k samples at the rollout temperature (k = rollout.group_size: the
group GRPO sees). Per target type, and over all:

    pass@1        the greedy answer is an exact match
    sample exact  the mean over examples of the share of its k samples that are exact (what GRPO's reward sees)
    pass@k        at least one of the k samples is exact (the best a policy that sharpens onto its own samples
                  could reach on these examples, read off one group)

RL from the model's own samples can at best move greedy (pass@1) toward pass@k; where pass@k is close to pass@1
there is little for it to sharpen (`LITTLE_TO_SHARPEN`). Exact is the evaluation's rule (shop_r1.metrics): an
unparseable response is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from shop_r1.reward.action import exact_match
from shop_r1.reward.format import parse_response
from shop_r1.types import ACTION_TYPES, Action

LITTLE_TO_SHARPEN = 0.05
"""pass@k - pass@1 below this (5 points) is said to leave RL little to sharpen."""


@dataclass(frozen=True)
class HeadroomRow:
    n: int
    pass_at_1: float
    sample_exact: float
    pass_at_k: float

    @property
    def gap(self) -> float:
        return self.pass_at_k - self.pass_at_1


@dataclass(frozen=True)
class Headroom:
    k: int
    temperature: float
    overall: HeadroomRow
    per_type: dict[str, HeadroomRow]

    def to_dict(self) -> dict:
        return {"k": self.k, "temperature": self.temperature, "overall": asdict(self.overall),
                "per_type": {t: asdict(r) for t, r in self.per_type.items()}}

    @classmethod
    def from_dict(cls, d: Mapping) -> Headroom:
        return cls(int(d["k"]), float(d["temperature"]), HeadroomRow(**d["overall"]),
                   {t: HeadroomRow(**r) for t, r in d["per_type"].items()})


def _exact(response: str, target: Action) -> bool:
    parsed = parse_response(response)
    return exact_match(parsed.action if parsed is not None else None, target)


def _row(items: Sequence[tuple[bool, Sequence[bool]]]) -> HeadroomRow:
    n = len(items)
    if n == 0:
        return HeadroomRow(0, 0.0, 0.0, 0.0)
    return HeadroomRow(n, sum(g for g, _ in items) / n, sum(sum(s) / len(s) for _, s in items) / n,
                       sum(any(s) for _, s in items) / n)


def compute_headroom(greedy: Sequence[str], samples: Sequence[Sequence[str]], targets: Sequence[Action],
                     temperature: float) -> Headroom:
    """greedy[i]: example i's greedy answer; samples[i]: its k samples (the same k for every example, k >= 1)."""
    if not len(greedy) == len(samples) == len(targets):
        raise ValueError(f"{len(greedy)} greedy answers, {len(samples)} sample lists, {len(targets)} targets")
    ks = {len(s) for s in samples}
    if len(ks) > 1 or 0 in ks:
        raise ValueError(f"every example needs the same number k >= 1 of samples, got {sorted(ks)}")
    items = [(_exact(g, t), [_exact(x, t) for x in s]) for g, s, t in zip(greedy, samples, targets)]
    per_type = {a: _row([it for it, t in zip(items, targets) if t.type == a]) for a in ACTION_TYPES
                if any(t.type == a for t in targets)}
    return Headroom(ks.pop() if ks else 0, temperature, _row(items), per_type)


def format_headroom(rows: Sequence[tuple[str, Headroom]]) -> str:
    """One line per (model label, headroom), over all and per target type (click / type_and_submit / terminate):
    pass@1, sample exact and pass@k in percent, then a note per model where pass@k is within LITTLE_TO_SHARPEN of
    pass@1."""
    if not rows:
        return ""
    k, temp = rows[0][1].k, rows[0][1].temperature
    head = ["Setting", "n", "pass@1 %", "sample exact %", f"pass@{k} %", "pass@1 c/t/x %", "sample c/t/x %",
            f"pass@{k} c/t/x %"]

    def by_type(h: Headroom, field: str) -> str:
        return "/".join(f"{100 * getattr(h.per_type[a], field):.0f}" if a in h.per_type else "-"
                        for a in ACTION_TYPES)

    cells = [[label, str(h.overall.n), f"{100 * h.overall.pass_at_1:.1f}", f"{100 * h.overall.sample_exact:.1f}",
              f"{100 * h.overall.pass_at_k:.1f}", by_type(h, "pass_at_1"), by_type(h, "sample_exact"),
              by_type(h, "pass_at_k")] for label, h in rows]
    widths = [max(len(r[j]) for r in (head, *cells)) for j in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    lines = [f"Headroom: greedy (pass@1) against {k} samples at temperature {temp:g} per example (pass@{k}: any of "
             "them exact), on the same examples; c/t/x = targets click / type_and_submit / terminate.",
             fmt(head), "-" * len(fmt(head)), *[fmt(r) for r in cells]]
    for label, h in rows:
        if h.overall.gap < LITTLE_TO_SHARPEN:
            lines.append(f"{label}: pass@{h.k} is within {100 * LITTLE_TO_SHARPEN:.0f} points of pass@1 "
                         f"({100 * h.overall.pass_at_k:.1f} vs {100 * h.overall.pass_at_1:.1f} %): little for RL "
                         "to sharpen.")
    return "\n".join(lines)
