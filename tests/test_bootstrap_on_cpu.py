"""Bootstrap intervals: the point values equal compute_metrics, intervals bracket them, and the paired difference
sees what two models do differently on the same examples."""

import pytest

from shop_r1.bootstrap import bootstrap_intervals, paired_difference
from shop_r1.metrics import compute_metrics
from shop_r1.types import Action

T = Action("terminate")
C = Action("click", name="buy")
RIGHT_C = '{"rationale": "r", "action": {"type": "click", "name": "buy"}}'
WRONG_C = '{"rationale": "r", "action": {"type": "click", "name": "nav.home"}}'
RIGHT_T = '{"rationale": "r", "action": {"type": "terminate"}}'


def test_points_equal_compute_metrics_and_intervals_bracket_them():
    targets = [C, C, C, T, T, C, T, C] * 5
    responses = [RIGHT_C, WRONG_C, "garbage", RIGHT_T, RIGHT_C, RIGHT_C, RIGHT_T, WRONG_C] * 5
    m = compute_metrics(responses, targets)
    got = bootstrap_intervals(responses, targets, num_resamples=500, seed=1)
    # By hand: exact = (RIGHT_C x2 on C, RIGHT_T x2 on T) = 4 of 8; type ok adds WRONG_C x2 on C -> 6 of 8.
    assert got["exact_match"].value == pytest.approx(0.5) == pytest.approx(m.exact_match)
    assert got["type_accuracy"].value == pytest.approx(0.75) == pytest.approx(m.type_accuracy)
    assert got["type_macro_f1"].value == pytest.approx(m.type_macro_f1)
    for iv in got.values():
        assert iv.low <= iv.value <= iv.high and iv.high - iv.low > 0.05
    assert bootstrap_intervals(responses, targets, num_resamples=500, seed=1) == got  # seeded


def test_a_constant_outcome_has_a_zero_width_interval():
    got = bootstrap_intervals([RIGHT_C] * 10, [C] * 10, num_resamples=200)
    assert got["exact_match"].low == got["exact_match"].high == 1.0


def test_paired_difference_of_a_strictly_better_model_is_positive():
    targets = [C] * 40
    a = [WRONG_C] * 30 + [RIGHT_C] * 10
    b = [RIGHT_C] * 30 + [RIGHT_C] * 10  # B fixes 30 examples and breaks none
    diff = paired_difference(a, b, targets, num_resamples=500)
    assert diff["exact_match"].value == pytest.approx(0.75)
    assert diff["exact_match"].low > 0.5
    same = paired_difference(a, a, targets, num_resamples=200)
    assert same["exact_match"].low == same["exact_match"].high == 0.0
