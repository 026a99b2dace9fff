"""Bootstrap confidence intervals for the evaluation metrics (exact match, type accuracy, type macro-F1).

Percentile bootstrap over held-out examples: resample the n examples with replacement `num_resamples` times,
recompute each metric exactly as `shop_r1.metrics.compute_metrics` does, and take the (1-level)/2 and (1+level)/2
quantiles. `paired_difference` resamples the *same* indices for two models on the same examples, so the interval of
their difference is not widened by the examples' own difficulty spread (the right test for "B beats A").
Pure numpy; seeded, so a table is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shop_r1.reward.action import exact_match
from shop_r1.reward.format import parse_response
from shop_r1.types import ACTION_TYPES, Action

METRICS = ("exact_match", "type_accuracy", "type_macro_f1")


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class _Outcomes:
    exact: np.ndarray  # [n] bool
    pred_type: np.ndarray  # [n] int: index into ACTION_TYPES, -1 for an unparseable response
    target_type: np.ndarray  # [n] int


def _outcomes(responses: Sequence[str], targets: Sequence[Action]) -> _Outcomes:
    if len(responses) != len(targets):
        raise ValueError(f"{len(responses)} responses for {len(targets)} targets")
    preds = [p.action if (p := parse_response(r)) is not None else None for r in responses]
    return _Outcomes(np.array([exact_match(p, t) for p, t in zip(preds, targets)], dtype=bool),
                     np.array([ACTION_TYPES.index(p.type) if p is not None else -1 for p in preds], dtype=np.int64),
                     np.array([ACTION_TYPES.index(t.type) for t in targets], dtype=np.int64))


def _metrics(o: _Outcomes, idx: np.ndarray) -> np.ndarray:
    """[R, 3] metrics for R resamples: idx [R, n] example indices."""
    exact = o.exact[idx].mean(axis=1)
    pred, target = o.pred_type[idx], o.target_type[idx]
    type_ok = pred == target
    f1s, present = [], []
    for k in range(len(ACTION_TYPES)):
        tp = (type_ok & (target == k)).sum(axis=1)
        fp = ((pred == k) & (target != k)).sum(axis=1)
        support = (target == k).sum(axis=1)
        precision = np.divide(tp, tp + fp, out=np.zeros(len(idx)), where=(tp + fp) > 0)
        recall = np.divide(tp, support, out=np.zeros(len(idx)), where=support > 0)
        denom = precision + recall
        f1s.append(np.divide(2 * precision * recall, denom, out=np.zeros(len(idx)), where=denom > 0))
        present.append(support > 0)
    f1, present_arr = np.stack(f1s, axis=1), np.stack(present, axis=1)
    macro = (f1 * present_arr).sum(axis=1) / np.maximum(present_arr.sum(axis=1), 1)
    return np.stack([exact, type_ok.mean(axis=1), macro], axis=1)


def _indices(n: int, num_resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(num_resamples, n))


def _interval(point: float, samples: np.ndarray, level: float) -> Interval:
    low, high = np.quantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(point), float(low), float(high))


def bootstrap_intervals(responses: Sequence[str], targets: Sequence[Action], num_resamples: int = 2000,
                        level: float = 0.95, seed: int = 0) -> dict[str, Interval]:
    """Point value and percentile interval of each metric in METRICS."""
    o = _outcomes(responses, targets)
    n = len(targets)
    if n == 0:
        return {m: Interval(0.0, 0.0, 0.0) for m in METRICS}
    point = _metrics(o, np.arange(n)[None, :])[0]
    samples = _metrics(o, _indices(n, num_resamples, seed))
    return {m: _interval(point[j], samples[:, j], level) for j, m in enumerate(METRICS)}


def paired_difference(responses_a: Sequence[str], responses_b: Sequence[str], targets: Sequence[Action],
                      num_resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict[str, Interval]:
    """Metric(B) - metric(A) on the same examples, with a paired percentile interval (B beats A when low > 0)."""
    a, b = _outcomes(responses_a, targets), _outcomes(responses_b, targets)
    n = len(targets)
    if n == 0:
        return {m: Interval(0.0, 0.0, 0.0) for m in METRICS}
    whole = np.arange(n)[None, :]
    point = _metrics(b, whole)[0] - _metrics(a, whole)[0]
    idx = _indices(n, num_resamples, seed)
    samples = _metrics(b, idx) - _metrics(a, idx)
    return {m: _interval(point[j], samples[:, j], level) for j, m in enumerate(METRICS)}
