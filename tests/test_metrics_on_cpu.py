"""Tables 2-3 metrics on a hand-made set, worked out by hand."""

import json
import subprocess
import sys

import pytest

from shop_r1.metrics import compute_metrics, format_metrics_table, load_predictions_jsonl
from shop_r1.types import Action


def r(action: dict) -> str:
    return json.dumps({"rationale": "because", "action": action})


TARGETS = [Action("click", "a"), Action("click", "b"), Action("type_and_submit", "q", "red shoes"),
           Action("terminate"), Action("terminate"), Action("type_and_submit", "q", "blue")]
RESPONSES = [
    r({"type": "click", "name": "a"}),                                # exact
    r({"type": "click", "name": "c"}),                                # type right, name wrong
    r({"type": "type_and_submit", "name": "q", "text": "Red  Shoes"}),  # exact after lowercasing/collapsing
    r({"type": "terminate"}),                                         # exact
    "garbage",                                                        # parse failure: wrong everywhere
    r({"type": "click", "name": "q"}),                                # wrong type (click for type_and_submit)
]


def test_hand_made_set():
    m = compute_metrics(RESPONSES, TARGETS)
    assert m.n == 6 and m.num_parse_failures == 1
    assert m.exact_match == pytest.approx(3 / 6)
    assert m.type_accuracy == pytest.approx(4 / 6)
    # click: TP 2, FP 1 (#6), FN 0 -> P 2/3, R 1, F1 0.8
    # type_and_submit: TP 1, FP 0, FN 1 -> P 1, R 1/2, F1 2/3
    # terminate: TP 1, FP 0, FN 1 (the parse failure) -> P 1, R 1/2, F1 2/3
    assert m.per_type["click"].f1 == pytest.approx(0.8)
    assert m.per_type["click"].precision == pytest.approx(2 / 3)
    assert m.per_type["type_and_submit"].f1 == pytest.approx(2 / 3)
    assert m.per_type["terminate"].f1 == pytest.approx(2 / 3)
    assert m.type_macro_f1 == pytest.approx((0.8 + 2 / 3 + 2 / 3) / 3)
    assert {k: v.exact_match for k, v in m.per_type.items()} == {"click": 0.5, "type_and_submit": 0.5,
                                                                 "terminate": 0.5}
    assert {k: v.type_accuracy for k, v in m.per_type.items()} == {"click": 1.0, "type_and_submit": 0.5,
                                                                   "terminate": 0.5}


def test_macro_f1_only_over_types_present_and_a_class_never_predicted():
    targets = [Action("terminate"), Action("terminate"), Action("click", "x")]
    responses = [r({"type": "terminate"}), r({"type": "terminate"}), r({"type": "terminate"})]
    m = compute_metrics(responses, targets)
    # terminate: TP 2, FP 1 -> P 2/3, R 1 -> F1 0.8; click: never predicted -> F1 0; no type_and_submit targets
    assert set(m.per_type) == {"terminate", "click"}
    assert m.type_macro_f1 == pytest.approx(0.4)


def test_empty_and_mismatched():
    assert compute_metrics([], []).exact_match == 0.0
    with pytest.raises(ValueError):
        compute_metrics(["x"], [])


def test_cli_json_and_table(tmp_path):
    path = tmp_path / "preds.jsonl"
    path.write_text("".join(json.dumps({"response": resp, "target": t.to_dict()}) + "\n"
                            for resp, t in zip(RESPONSES, TARGETS)))
    out = subprocess.run([sys.executable, "-m", "shop_r1.cli", "eval", "metrics", "--input", str(path), "--json"],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert set(result) >= {"n", "exact_match", "type_accuracy", "type_macro_f1", "per_type"}
    assert result["exact_match"] == pytest.approx(0.5)
    table = format_metrics_table(compute_metrics(*load_predictions_jsonl(path)), title="demo")
    assert "type_and_submit" in table and "50.00%" in table
    # kappa 7/13 (tests/test_bootstrap_sessions_on_cpu.py works it out); mixes in %: c/t/x/? 50/17/17/17.
    assert "kappa(type) +0.538" in table and "predicted mix c/t/x/? 50/17/17/17" in table
    assert result["type_kappa"] == pytest.approx(7 / 13) and result["exact_match_non_terminate"] == pytest.approx(0.5)


def test_bad_prediction_line_is_named(tmp_path):
    path = tmp_path / "preds.jsonl"
    path.write_text(json.dumps({"response": "x", "target": {"type": "click"}}) + "\n")
    with pytest.raises(ValueError, match=r"preds\.jsonl:1: target\.name"):
        load_predictions_jsonl(path)
