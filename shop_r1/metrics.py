"""Evaluation metrics of Tables 2-3: exact action accuracy, action-type accuracy and macro-F1, per type.

- exact match: `shop_r1.reward.action.exact_match` (one rule for the metric and the binary reward);
- type accuracy: the predicted type equals the target's; a response that does not parse is wrong;
- macro-F1 over the action types present in the targets. An unparseable response counts as a false negative of its
  target's class and a false positive of no class.

Beside them, what a trivial answer would make of the same numbers (issue 21): Cohen's kappa of predicted vs target
type (an unparseable response is a category of its own, which no target has), exact match on the targets that are
not `terminate` (a constant `terminate` scores 0 there), and the predicted type mix beside the target mix (a gain
that is only a shift of the prior shows as a mix moving toward the commonest target).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from shop_r1.data.jsonl import read_jsonl_objects
from shop_r1.reward.action import exact_match
from shop_r1.reward.format import parse_response
from shop_r1.types import ACTION_TYPES, Action

PREDICTED_KINDS: tuple[str, ...] = (*ACTION_TYPES, "invalid")
"""Categories of a prediction: the action types, and `invalid` for a response that does not parse."""


@dataclass(frozen=True)
class TypeMetrics:
    n: int
    exact_match: float
    type_accuracy: float
    precision: float
    recall: float
    f1: float


@dataclass(frozen=True)
class EvalMetrics:
    n: int
    exact_match: float
    type_accuracy: float
    type_macro_f1: float
    per_type: dict[str, TypeMetrics]
    num_parse_failures: int
    type_kappa: float = 0.0
    """Cohen's kappa of predicted vs target action type; 0 for any constant answer (see `cohens_kappa`)."""
    exact_match_non_terminate: float = 0.0
    """Exact match over the click and type_and_submit targets only (0.0 when there are none)."""
    predicted_mix: dict[str, float] | None = None
    """Share of responses per PREDICTED_KINDS (sums to 1 when n > 0)."""
    target_mix: dict[str, float] | None = None
    """Share of targets per ACTION_TYPES."""

    def to_dict(self) -> dict:
        return {"n": self.n, "exact_match": self.exact_match, "type_accuracy": self.type_accuracy,
                "type_macro_f1": self.type_macro_f1, "num_parse_failures": self.num_parse_failures,
                "per_type": {k: asdict(v) for k, v in self.per_type.items()},
                "type_kappa": self.type_kappa, "exact_match_non_terminate": self.exact_match_non_terminate,
                "predicted_mix": dict(self.predicted_mix or {}), "target_mix": dict(self.target_mix or {})}


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0


KAPPA_EPS = 1e-12
"""1 - p_e at or below this counts as 0 (kappa undefined -> 0), here and in `shop_r1.bootstrap`."""


def cohens_kappa(predicted: Sequence[str], target: Sequence[str]) -> float:
    """(p_o - p_e) / (1 - p_e): p_o the share of agreement, p_e = sum over categories of the predicted share times
    the target share. When p_e = 1 (every prediction and every target the same one category) nothing beyond chance
    can be measured and kappa is 0 by our convention, as for every other constant answer."""
    if len(predicted) != len(target):
        raise ValueError(f"{len(predicted)} predicted categories for {len(target)} targets")
    n = len(target)
    if n == 0:
        return 0.0
    p_o = sum(p == t for p, t in zip(predicted, target)) / n
    p_e = sum(predicted.count(k) * target.count(k) for k in set(target)) / (n * n)
    return (p_o - p_e) / (1 - p_e) if 1 - p_e > KAPPA_EPS else 0.0



def compute_metrics(responses: Sequence[str], targets: Sequence[Action]) -> EvalMetrics:
    if len(responses) != len(targets):
        raise ValueError(f"{len(responses)} responses for {len(targets)} targets")
    preds = []
    for text in responses:
        parsed = parse_response(text)
        preds.append(parsed.action if parsed is not None else None)
    n = len(targets)
    exact = [exact_match(p, t) for p, t in zip(preds, targets)]
    type_ok = [p is not None and p.type == t.type for p, t in zip(preds, targets)]
    per_type: dict[str, TypeMetrics] = {}
    for kind in ACTION_TYPES:
        idx = [i for i, t in enumerate(targets) if t.type == kind]
        if not idx:
            continue
        tp = sum(type_ok[i] for i in idx)
        fp = sum(1 for p, t in zip(preds, targets) if p is not None and p.type == kind and t.type != kind)
        precision, recall = _ratio(tp, tp + fp), _ratio(tp, len(idx))
        f1 = _ratio(2 * precision * recall, precision + recall) if precision + recall else 0.0
        per_type[kind] = TypeMetrics(len(idx), _ratio(sum(exact[i] for i in idx), len(idx)), recall,
                                     precision, recall, f1)
    macro = sum(m.f1 for m in per_type.values()) / len(per_type) if per_type else 0.0
    pred_kinds = [p.type if p is not None else "invalid" for p in preds]
    target_kinds = [t.type for t in targets]
    non_terminate = [i for i, t in enumerate(targets) if t.type != "terminate"]
    return EvalMetrics(n, _ratio(sum(exact), n), _ratio(sum(type_ok), n), macro, per_type,
                       sum(p is None for p in preds), type_kappa=cohens_kappa(pred_kinds, target_kinds),
                       exact_match_non_terminate=_ratio(sum(exact[i] for i in non_terminate), len(non_terminate)),
                       predicted_mix={k: _ratio(pred_kinds.count(k), n) for k in PREDICTED_KINDS},
                       target_mix={k: _ratio(target_kinds.count(k), n) for k in ACTION_TYPES})


def format_metrics_table(metrics: EvalMetrics, title: str | None = None) -> str:
    lines = [title] if title else []
    lines.append(f"n={metrics.n}  exact match {100 * metrics.exact_match:.2f}%  type accuracy "
                 f"{100 * metrics.type_accuracy:.2f}%  type macro-F1 {100 * metrics.type_macro_f1:.2f}%  "
                 f"unparseable {metrics.num_parse_failures}")
    lines.append(f"kappa(type) {metrics.type_kappa:+.3f}  exact on non-terminate targets "
                 f"{100 * metrics.exact_match_non_terminate:.2f}%  predicted mix {format_mix(metrics.predicted_mix)}"
                 f"  target mix {format_mix(metrics.target_mix)}")
    header = f"{'action type':<18}{'n':>6}{'exact':>10}{'type acc':>10}{'precision':>11}{'recall':>9}{'F1':>9}"
    lines += [header, "-" * len(header)]
    for kind, m in metrics.per_type.items():
        lines.append(f"{kind:<18}{m.n:>6d}{100 * m.exact_match:>9.2f}%{100 * m.type_accuracy:>9.2f}%"
                     f"{100 * m.precision:>10.2f}%{100 * m.recall:>8.2f}%{100 * m.f1:>8.2f}%")
    return "\n".join(lines)


def load_predictions_jsonl(path: str | Path) -> tuple[list[str], list[Action]]:
    """Lines {"response": str, "target": {action}}; a bad line is an error naming FILE:LINE."""
    responses, targets = [], []
    for where, obj in read_jsonl_objects(path):
        if not isinstance(obj.get("response"), str):
            raise ValueError(f"{where}: response: expected a string field 'response'")
        responses.append(obj["response"])
        targets.append(Action.from_dict(obj.get("target"), where=f"{where}: target"))
    return responses, targets


def format_mix(mix: dict[str, float] | None) -> str:
    """`c/t/x/? 50/10/40/0`: the shares in % of click, type_and_submit, terminate and (if given) invalid."""
    if not mix:
        return "-"
    letters = {"click": "c", "type_and_submit": "t", "terminate": "x", "invalid": "?"}
    keys = [k for k in PREDICTED_KINDS if k in mix]
    return "/".join(letters[k] for k in keys) + " " + "/".join(f"{100 * mix[k]:.0f}" for k in keys)


def session_of(example_id: str) -> str:
    """An example id is `<session_id>:<step_index>`; the session is the part before the last colon."""
    return example_id.rsplit(":", 1)[0]


@dataclass(frozen=True)
class Predictions:
    """One setting's responses on held-out examples, aligned by position."""

    example_ids: tuple[str, ...]
    responses: tuple[str, ...]
    targets: tuple[Action, ...]

    def __post_init__(self) -> None:
        if not len(self.example_ids) == len(self.responses) == len(self.targets):
            raise ValueError(f"{len(self.example_ids)} ids, {len(self.responses)} responses, {len(self.targets)} "
                             "targets: they must align")

    @property
    def sessions(self) -> tuple[str, ...]:
        return tuple(session_of(e) for e in self.example_ids)

    def select(self, example_ids: Sequence[str]) -> Predictions:
        """These predictions in the order of `example_ids` (every id must be present)."""
        where = {e: i for i, e in enumerate(self.example_ids)}
        missing = [e for e in example_ids if e not in where]
        if missing:
            raise ValueError(f"{len(missing)} example ids have no prediction, e.g. {missing[0]!r}")
        idx = [where[e] for e in example_ids]
        return Predictions(tuple(example_ids), tuple(self.responses[i] for i in idx),
                           tuple(self.targets[i] for i in idx))


def load_predictions(path: str | Path) -> Predictions:
    """Lines {"example_id": str, "response": str, "target": {action}} (`.jsonl` or `.jsonl.gz`); the example id is
    required (the bootstrap resamples its session). A bad line is an error naming FILE:LINE."""
    ids, responses, targets = [], [], []
    for where, obj in read_jsonl_objects(Path(path)):
        if not isinstance(obj.get("example_id"), str):
            raise ValueError(f"{where}: example_id: expected a string field 'example_id'")
        if not isinstance(obj.get("response"), str):
            raise ValueError(f"{where}: response: expected a string field 'response'")
        ids.append(obj["example_id"])
        responses.append(obj["response"])
        targets.append(Action.from_dict(obj.get("target"), where=f"{where}: target"))
    return Predictions(tuple(ids), tuple(responses), tuple(targets))


def write_predictions(predictions: Predictions, path: str | Path) -> Path:
    """The lines `load_predictions` reads; gzip-compressed (reproducibly: no name or time in the header) when the
    name ends in `.gz`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"example_id": e, "response": r, "target": t.to_dict()}, ensure_ascii=False) + "\n"
                   for e, r, t in zip(predictions.example_ids, predictions.responses, predictions.targets))
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path
