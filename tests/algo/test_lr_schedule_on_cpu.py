import math

import pytest

from shop_r1.algo.lr_schedule import COSINE_FLOOR, lr_multiplier


def test_warmup_then_constant():
    assert [lr_multiplier(s, 10, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_multiplier(0, 10, 0) == 1.0


def test_cosine_starts_at_peak_after_warmup_and_ends_at_the_floor():
    # 2 warmup steps, then 9 decay steps: step 2 is the peak, step 10 (the last) the floor, step 6 half-way.
    assert lr_multiplier(1, 11, 2, "cosine") == 1.0
    assert lr_multiplier(2, 11, 2, "cosine") == pytest.approx(1.0)
    assert lr_multiplier(6, 11, 2, "cosine") == pytest.approx(COSINE_FLOOR + (1 - COSINE_FLOOR) * 0.5)
    assert lr_multiplier(10, 11, 2, "cosine") == pytest.approx(COSINE_FLOOR)
    values = [lr_multiplier(s, 11, 2, "cosine") for s in range(2, 11)]
    assert all(a > b for a, b in zip(values, values[1:]))
    assert lr_multiplier(4, 11, 2, "cosine") == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 / 8)))


def test_unknown_schedule_is_an_error():
    with pytest.raises(ValueError, match="schedule"):
        lr_multiplier(0, 10, 0, "linear")
