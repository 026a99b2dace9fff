"""Cohen's kappa and the session (cluster) bootstrap, on sets small enough to work out by hand."""

import numpy as np
import pytest

from shop_r1.bootstrap import (
    METRICS,
    bootstrap_distribution,
    bootstrap_intervals,
    paired_difference,
    session_counts,
    session_weights,
)
from shop_r1.metrics import cohens_kappa, compute_metrics, session_of
from shop_r1.types import Action

T = Action("terminate")
C = Action("click", name="buy")
Q = Action("type_and_submit", name="search_input", text="red shoes")
RIGHT_C = '{"rationale": "r", "action": {"type": "click", "name": "buy"}}'
WRONG_C = '{"rationale": "r", "action": {"type": "click", "name": "nav.home"}}'
RIGHT_T = '{"rationale": "r", "action": {"type": "terminate"}}'
RIGHT_Q = '{"rationale": "r", "action": {"type": "type_and_submit", "name": "search_input", "text": "Red Shoes"}}'


def test_kappa_by_hand():
    # p_o = 3/4; predicted c 3/4, x 1/4; targets c 1/2, x 1/2 -> p_e = 3/8 + 1/8 = 1/2; kappa = (3/4-1/2)/(1/2) = 1/2
    assert cohens_kappa(["c", "c", "x", "c"], ["c", "c", "x", "x"]) == pytest.approx(0.5)
    # A constant answer: p_o = share of that class = p_e -> 0, whatever the targets.
    assert cohens_kappa(["x"] * 5, ["x", "x", "c", "t", "c"]) == 0.0
    # Every prediction and target one class: p_e = 1, kappa undefined -> 0 by convention.
    assert cohens_kappa(["x"] * 3, ["x"] * 3) == 0.0
    # Perfect agreement on two classes -> 1; the unparseable category is one no target has (p_e gets nothing).
    assert cohens_kappa(["c", "x"], ["c", "x"]) == pytest.approx(1.0)
    # p_o = 1/2; predicted invalid 1/2, x 1/2; targets c 1/2, x 1/2 -> p_e = 1/4; kappa = (1/4)/(3/4) = 1/3
    assert cohens_kappa(["invalid", "x"], ["c", "x"]) == pytest.approx(1 / 3)


def test_new_metrics_by_hand():
    targets = [C, C, Q, T, T, Q]
    responses = [RIGHT_C, WRONG_C, RIGHT_Q, RIGHT_T, "garbage", RIGHT_C]
    m = compute_metrics(responses, targets)
    # Non-terminate targets #0 #1 #2 #5: exact 1, 0, 1, 0 -> 1/2.
    assert m.exact_match_non_terminate == pytest.approx(0.5)
    assert m.predicted_mix == pytest.approx({"click": 3 / 6, "type_and_submit": 1 / 6, "terminate": 1 / 6,
                                             "invalid": 1 / 6})
    assert m.target_mix == pytest.approx({"click": 1 / 3, "type_and_submit": 1 / 3, "terminate": 1 / 3})
    # p_o = 4/6; p_e = (3*2 + 1*2 + 1*2) / 36 = 5/18 -> kappa = (12/18 - 5/18) / (13/18) = 7/13
    assert m.type_kappa == pytest.approx(7 / 13)
    d = m.to_dict()
    assert {"n", "exact_match", "type_accuracy", "type_macro_f1", "num_parse_failures", "per_type"} <= set(d)
    assert d["type_kappa"] == pytest.approx(7 / 13) and d["predicted_mix"]["invalid"] == pytest.approx(1 / 6)


def test_bootstrap_points_equal_compute_metrics_for_every_metric():
    targets = [C, C, Q, T, T, Q, C, T]
    responses = [RIGHT_C, WRONG_C, RIGHT_Q, RIGHT_T, "garbage", RIGHT_C, RIGHT_T, RIGHT_C]
    sessions = ["a", "a", "a", "b", "b", "c", "c", "c"]
    m = compute_metrics(responses, targets)
    got = bootstrap_intervals(responses, targets, num_resamples=300, sessions=sessions)
    assert set(got) == set(METRICS)
    for key in METRICS:
        assert got[key].value == pytest.approx(getattr(m, key))
        assert got[key].low <= got[key].value + 1e-12 and got[key].value <= got[key].high + 1e-12


def test_session_of_and_session_counts():
    assert session_of("synth-00012:3") == "synth-00012" and session_of("a:b:7") == "a:b"
    c = session_counts([RIGHT_C, WRONG_C, RIGHT_T], [C, C, T], ["s2", "s1", "s2"])
    assert c.sessions == ("s2", "s1")  # order of first appearance
    # F = 4*3 confusion cells + 3 exact cells; session s2 holds one exact click and one exact terminate.
    assert c.counts.shape == (2, 15) and c.counts[0].sum() == 4 and c.counts[1].sum() == 1


def test_session_weights_draw_whole_sessions():
    w = session_weights(5, 200, seed=3)
    assert w.shape == (200, 5) and (w.sum(axis=1) == 5).all() and (w >= 0).all()
    assert (session_weights(5, 200, seed=3) == w).all()  # seeded


def test_one_session_has_a_zero_width_interval_where_the_example_bootstrap_has_not():
    # 4 steps of ONE session, 2 right and 2 wrong: every resample draws that session, so every resample is 2/4.
    responses, targets = [RIGHT_C, RIGHT_C, WRONG_C, WRONG_C], [C] * 4
    one = bootstrap_intervals(responses, targets, num_resamples=500, sessions=["s"] * 4)["exact_match"]
    assert one.low == one.value == one.high == 0.5
    steps = bootstrap_intervals(responses, targets, num_resamples=500)["exact_match"]
    assert steps.low < 0.5 < steps.high


def test_unequal_sessions_resample_to_pooled_values_by_hand():
    # Session A: 1 example, right; session B: 3 examples, wrong. Two draws with replacement:
    #   AA (p 1/4): 2 of 2 right = 1;  AB or BA (p 1/2): 1 of 4 = 1/4;  BB (p 1/4): 0 of 6 = 0.
    # (Pooled over the drawn examples, not a mean of per-session means, which would give 1/2 for AB.)
    responses, targets = [RIGHT_C, WRONG_C, WRONG_C, WRONG_C], [C] * 4
    samples = bootstrap_distribution(responses, targets, ["A", "B", "B", "B"], num_resamples=4000, seed=0)
    exact = samples["exact_match"]
    assert set(np.round(exact, 6)) == {0.0, 0.25, 1.0}
    assert np.mean(exact == 1.0) == pytest.approx(0.25, abs=0.03)
    assert np.mean(exact == 0.25) == pytest.approx(0.5, abs=0.03)
    iv = bootstrap_intervals(responses, targets, num_resamples=4000, sessions=["A", "B", "B", "B"])["exact_match"]
    assert iv.value == 0.25 and iv.low == 0.0 and iv.high == 1.0
    # Constant answers: kappa is 0 in every resample, so its interval is [0, 0].
    kappa = bootstrap_intervals([RIGHT_T] * 4, [C, T, T, C], num_resamples=200, sessions=["A", "B", "B", "C"])
    assert kappa["type_kappa"].low == kappa["type_kappa"].high == 0.0


def test_no_sessions_is_the_example_bootstrap():
    responses, targets = [RIGHT_C, WRONG_C, RIGHT_T, "x", RIGHT_C], [C, C, T, T, C]
    by_example = bootstrap_intervals(responses, targets, num_resamples=300, seed=4)
    own = bootstrap_intervals(responses, targets, num_resamples=300, seed=4, sessions=[f"s{i}" for i in range(5)])
    assert by_example == own


def test_paired_difference_resamples_sessions_by_hand():
    # Two sessions of two steps; A is wrong everywhere, B right on session s1 only: point 2/4 = 1/2.
    # Draws: s1 s1 -> 1, s1 s2 -> 1/2, s2 s2 -> 0 (both rows always on the same draw).
    targets = [C] * 4
    a, b = [WRONG_C] * 4, [RIGHT_C, RIGHT_C, WRONG_C, WRONG_C]
    sessions = ["s1", "s1", "s2", "s2"]
    diff = paired_difference(a, b, targets, num_resamples=2000, sessions=sessions)["exact_match"]
    assert diff.value == pytest.approx(0.5) and diff.low == 0.0 and diff.high == 1.0
    same = paired_difference(b, b, targets, num_resamples=200, sessions=sessions)
    assert all(iv.low == iv.high == 0.0 for iv in same.values())
    # Exact on non-terminate targets moves with exact here (no terminate target).
    assert paired_difference(a, b, targets, num_resamples=50, sessions=sessions)[
        "exact_match_non_terminate"].value == pytest.approx(0.5)


def test_mismatched_lengths_are_errors():
    with pytest.raises(ValueError, match="session ids"):
        bootstrap_intervals([RIGHT_C], [C], sessions=["a", "b"])
    with pytest.raises(ValueError, match="responses"):
        bootstrap_intervals([RIGHT_C, RIGHT_C], [C])
