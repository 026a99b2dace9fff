"""Bootstrap confidence intervals for the evaluation metrics, resampling sessions (a cluster bootstrap).

The steps of one session share a shopper, a query and pages, so they are not independent draws: resampling steps
would make intervals too narrow. Here the independent unit is the session (id = the example id before its last
colon, `shop_r1.metrics.session_of`): each resample draws the S sessions with replacement and takes all of their
examples, then recomputes every metric in METRICS exactly as `shop_r1.metrics.compute_metrics` does, and the
interval is the (1-level)/2 and (1+level)/2 quantiles. Without session ids every example is its own session (the
plain example bootstrap). `paired_difference` uses the *same* session draws for two settings on the same examples,
so the interval of their difference is not widened by the sessions' own difficulty spread (the test for "B beats
A": low > 0).

Every metric is a function of per-example counts (the predicted x target type confusion and exact hits per target
type), so a session is summarised once as a count vector and a resample is a weight matrix [R, S] times the session
counts [S, F]. Pure numpy; seeded, so a table is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shop_r1.metrics import KAPPA_EPS
from shop_r1.reward.action import exact_match
from shop_r1.reward.format import parse_response
from shop_r1.types import ACTION_TYPES, Action

METRICS = ("exact_match", "type_accuracy", "type_macro_f1", "type_kappa", "exact_match_non_terminate")
K = len(ACTION_TYPES)
"""Target categories; a prediction has K + 1 (the last: unparseable)."""
TERMINATE = ACTION_TYPES.index("terminate")


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


def _example_counts(responses: Sequence[str], targets: Sequence[Action]) -> np.ndarray:
    """[n, F] per example: a one-hot of (predicted type, target type) in the (K+1) x K confusion, then a one-hot of
    the target type if the response is an exact match. F = (K+1)*K + K."""
    if len(responses) != len(targets):
        raise ValueError(f"{len(responses)} responses for {len(targets)} targets")
    out = np.zeros((len(targets), (K + 1) * K + K))
    for i, (text, target) in enumerate(zip(responses, targets)):
        parsed = parse_response(text)
        pred = parsed.action if parsed is not None else None
        p, t = (ACTION_TYPES.index(pred.type) if pred is not None else K), ACTION_TYPES.index(target.type)
        out[i, p * K + t] = 1
        if exact_match(pred, target):
            out[i, (K + 1) * K + t] = 1
    return out


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(a.shape), where=b > 0)


def metrics_from_counts(counts: np.ndarray) -> np.ndarray:
    """[R, len(METRICS)] from summed counts [R, F]: the formulas of `compute_metrics`, vectorised."""
    conf = counts[:, :(K + 1) * K].reshape(-1, K + 1, K)  # [R, predicted K+1, target K]
    hits = counts[:, (K + 1) * K:]  # [R, K] exact matches per target type
    n = conf.sum(axis=(1, 2))
    support = conf.sum(axis=1)  # [R, K]
    predicted = conf.sum(axis=2)[:, :K]  # [R, K]; unparseable responses are predicted as no type
    tp = np.stack([conf[:, k, k] for k in range(K)], axis=1)
    precision, recall = _ratio(tp, predicted), _ratio(tp, support)
    f1 = _ratio(2 * precision * recall, precision + recall)
    present = support > 0
    macro = _ratio((f1 * present).sum(axis=1), present.sum(axis=1).astype(float))
    p_o = _ratio(tp.sum(axis=1), n)
    p_e = _ratio((predicted * support).sum(axis=1), n * n)
    kappa = np.where(1 - p_e > KAPPA_EPS, (p_o - p_e) / np.where(1 - p_e > KAPPA_EPS, 1 - p_e, 1.0), 0.0)
    non_term = [k for k in range(K) if k != TERMINATE]
    exact_nt = _ratio(hits[:, non_term].sum(axis=1), support[:, non_term].sum(axis=1))
    return np.stack([_ratio(hits.sum(axis=1), n), p_o, macro, kappa, exact_nt], axis=1)


@dataclass(frozen=True)
class SessionCounts:
    sessions: tuple[str, ...]
    """The distinct sessions, in order of first appearance."""
    counts: np.ndarray  # [S, F] summed example counts per session


def session_counts(responses: Sequence[str], targets: Sequence[Action],
                   sessions: Sequence[str] | None = None) -> SessionCounts:
    """Example counts summed per session; `sessions` None: every example is its own session."""
    per_example = _example_counts(responses, targets)
    if sessions is None:
        return SessionCounts(tuple(str(i) for i in range(len(targets))), per_example)
    if len(sessions) != len(targets):
        raise ValueError(f"{len(sessions)} session ids for {len(targets)} targets")
    order = list(dict.fromkeys(sessions))
    index = {s: j for j, s in enumerate(order)}
    out = np.zeros((len(order), per_example.shape[1]))
    np.add.at(out, [index[s] for s in sessions], per_example)
    return SessionCounts(tuple(order), out)


def session_weights(num_sessions: int, num_resamples: int, seed: int) -> np.ndarray:
    """[R, S]: how many times each session is drawn in each resample (each row sums to S)."""
    idx = np.random.default_rng(seed).integers(0, num_sessions, size=(num_resamples, num_sessions))
    offsets = num_sessions * np.arange(num_resamples)[:, None]
    return np.bincount((idx + offsets).ravel(), minlength=num_resamples * num_sessions).reshape(
        num_resamples, num_sessions).astype(float)


def bootstrap_distribution(responses: Sequence[str], targets: Sequence[Action], sessions: Sequence[str] | None = None,
                           num_resamples: int = 2000, seed: int = 0) -> dict[str, np.ndarray]:
    """The resampled values [R] of each metric in METRICS (sessions drawn with replacement)."""
    c = session_counts(responses, targets, sessions)
    samples = metrics_from_counts(session_weights(len(c.sessions), num_resamples, seed) @ c.counts)
    return {m: samples[:, j] for j, m in enumerate(METRICS)}


def _interval(point: float, samples: np.ndarray, level: float) -> Interval:
    low, high = np.quantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(point), float(low), float(high))


def _zero() -> dict[str, Interval]:
    return {m: Interval(0.0, 0.0, 0.0) for m in METRICS}


def bootstrap_intervals(responses: Sequence[str], targets: Sequence[Action], num_resamples: int = 2000,
                        level: float = 0.95, seed: int = 0, sessions: Sequence[str] | None = None
                        ) -> dict[str, Interval]:
    """Point value and percentile interval of each metric in METRICS, resampling `sessions` (one per example)."""
    if not targets:
        return _zero()
    c = session_counts(responses, targets, sessions)
    point = metrics_from_counts(c.counts.sum(axis=0, keepdims=True))[0]
    samples = metrics_from_counts(session_weights(len(c.sessions), num_resamples, seed) @ c.counts)
    return {m: _interval(point[j], samples[:, j], level) for j, m in enumerate(METRICS)}


def paired_difference(responses_a: Sequence[str], responses_b: Sequence[str], targets: Sequence[Action],
                      num_resamples: int = 2000, level: float = 0.95, seed: int = 0,
                      sessions: Sequence[str] | None = None) -> dict[str, Interval]:
    """Metric(B) - metric(A) on the same examples, with a paired percentile interval (B beats A when low > 0)."""
    if not targets:
        return _zero()
    a, b = session_counts(responses_a, targets, sessions), session_counts(responses_b, targets, sessions)
    point = (metrics_from_counts(b.counts.sum(axis=0, keepdims=True))
             - metrics_from_counts(a.counts.sum(axis=0, keepdims=True)))[0]
    weights = session_weights(len(a.sessions), num_resamples, seed)
    samples = metrics_from_counts(weights @ b.counts) - metrics_from_counts(weights @ a.counts)
    return {m: _interval(point[j], samples[:, j], level) for j, m in enumerate(METRICS)}
