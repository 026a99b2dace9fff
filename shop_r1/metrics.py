"""Evaluation metrics of Tables 2-3: exact action accuracy, action-type accuracy and macro-F1, per type.

- exact match: `shop_r1.reward.action.exact_match` (one rule for the metric and the binary reward);
- type accuracy: the predicted type equals the target's; a response that does not parse is wrong;
- macro-F1 over the action types present in the targets. An unparseable response counts as a false negative of its
  target's class and a false positive of no class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from shop_r1.data.jsonl import read_jsonl_objects
from shop_r1.reward.action import exact_match
from shop_r1.reward.format import parse_response
from shop_r1.types import ACTION_TYPES, Action


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

    def to_dict(self) -> dict:
        return {"n": self.n, "exact_match": self.exact_match, "type_accuracy": self.type_accuracy,
                "type_macro_f1": self.type_macro_f1, "num_parse_failures": self.num_parse_failures,
                "per_type": {k: asdict(v) for k, v in self.per_type.items()}}


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0


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
    return EvalMetrics(n, _ratio(sum(exact), n), _ratio(sum(type_ok), n), macro, per_type,
                       sum(p is None for p in preds))


def format_metrics_table(metrics: EvalMetrics, title: str | None = None) -> str:
    lines = [title] if title else []
    lines.append(f"n={metrics.n}  exact match {100 * metrics.exact_match:.2f}%  type accuracy "
                 f"{100 * metrics.type_accuracy:.2f}%  type macro-F1 {100 * metrics.type_macro_f1:.2f}%  "
                 f"unparseable {metrics.num_parse_failures}")
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
