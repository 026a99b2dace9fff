"""GRPO's per-step sampling seeds: vLLM seeds a request's i-th of n samples `seed + i`, so the steps' seed ranges
[seed, seed + n) must not overlap (they did when the step seed was `base + step`: n - 1 shared streams a step)."""

import pytest

from shop_r1.types import step_sampling_seed


@pytest.mark.parametrize("n", [1, 4, 8, 16])
def test_no_two_steps_share_a_sample_stream(n):
    streams = [step_sampling_seed(0, t, n) + i for t in range(300) for i in range(n)]
    assert len(set(streams)) == len(streams) == 300 * n


def test_hand_computed_values_and_run_seeds_apart():
    assert step_sampling_seed(0, 0, 8) == 0 and step_sampling_seed(0, 3, 8) == 24
    assert step_sampling_seed(1, 0, 8) == 2**32 and step_sampling_seed(1, 2, 4) == 2**32 + 8
    run0 = {step_sampling_seed(0, t, 8) + i for t in range(1000) for i in range(8)}
    run1 = {step_sampling_seed(1, t, 8) + i for t in range(1000) for i in range(8)}
    assert not run0 & run1
    assert 0 <= step_sampling_seed(-1, 10**6, 64) < 2**63  # any int seed; within torch's generator range


def test_a_bad_step_or_group_size_is_refused():
    with pytest.raises(ValueError, match="step >= 0 and n >= 1"):
        step_sampling_seed(0, -1, 8)
    with pytest.raises(ValueError, match="step >= 0 and n >= 1"):
        step_sampling_seed(0, 0, 0)
