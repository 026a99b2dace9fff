"""The weight-sync backend follows the actors' placement, not the driver's hardware."""

import pytest

from shop_r1.distributed.weight_sync import sync_backend


@pytest.mark.parametrize("per_rank, per_engine, want", [
    (1, 1, "nccl"),        # every party on whole GPUs of its own: NCCL
    (2, 1, "nccl"),
    (0, 0, "gloo"),        # CPU
    (1, 0, "gloo"),        # GPU learner, CPU engines
    (0.5, 0.5, "gloo"),    # fractional: sender and an engine may share a card, which NCCL refuses
    (1, 0.5, "gloo"),
])
def test_sync_backend_from_placement(per_rank, per_engine, want):
    assert sync_backend(per_rank, per_engine) == want
