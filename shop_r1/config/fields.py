"""The pieces every section is made of: `ConfigError`, a numeric field's allowed values (`Range`) and the field
that declares them (`bounded`). Imports nothing of the package, so every section module can import it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from shop_r1.errors import UserError


class ConfigError(UserError, ValueError):
    """A config key that does not exist, or a value that does not fit the field's type or range."""


@dataclass(frozen=True)
class Range:
    """The allowed values of one numeric field: an interval, each end open or closed, None for no bound."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        # inf and -inf are in no range (an unbounded side means "any finite number"); the comparisons below are
        # written so that NaN fails them too.
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return bool(above and below)

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


def bounded(default: float, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None) -> Any:
    """A numeric field's default and its allowed values, declared on the field: `x: int = bounded(8, ge=2)`.
    `check_ranges` reads the bound from the field's metadata (`RANGES`); a value out of it is a `ConfigError`."""
    if (ge is not None and gt is not None) or (le is not None and lt is not None):
        raise TypeError("bounded: give at most one lower bound (ge or gt) and one upper bound (le or lt)")
    low, high = ge if gt is None else gt, le if lt is None else lt
    allowed = Range(low, high, low_open=gt is not None, high_open=lt is not None)
    if default not in allowed:
        raise ValueError(f"bounded: the default {default!r} is not {allowed}")
    return field(default=default, metadata={"range": allowed})
