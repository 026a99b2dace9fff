"""eval: the held-out evaluations (Tables 2-5) and the headroom samples beside them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shop_r1.config.fields import bounded


@dataclass
class EvalConfig:
    temperature: float = bounded(0.0, ge=0)
    """0 is greedy decoding (the default for reported tables); the paper's sampling temperature is 0.6."""
    max_new_tokens: int = bounded(256, ge=1)
    """Response budget of one evaluated prediction."""
    max_examples: int = bounded(0, ge=0)
    """Evaluate at most this many held-out examples (0: all)."""
    split: Literal["test", "val"] = "test"
    """Which held-out examples the pipeline's evaluations read: `val` (needs `data.val_fraction` > 0) while choosing
    models and settings, `test` once, for the final table."""
    headroom_examples: int = bounded(256, ge=0)
    """Headroom (issue 45; shop_r1/headroom.py): on this many of the evaluated examples (a sample seeded by `seed`;
    all when fewer), rollout.group_size samples at rollout.temperature beside the greedy answer, for pass@1, sample
    exact and pass@k per target type (samples.jsonl, headroom.json, the tables). 0: no samples drawn."""
    zero_shot: bool = True
    """Whether the pipeline evaluates the starting model (Table 2's zero-shot row). A model built from scratch
    (model.from_scratch) has no zero-shot ability to measure: its row is 0.00 % unparseable answers in every run."""

