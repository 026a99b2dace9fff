"""The weight-sync backend follows the actors' placement, not the driver's hardware; a named transport is checked."""

import pytest

from shop_r1.distributed.sync_group import choose_transport, sync_backend


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


@pytest.mark.parametrize("transport, local, want", [
    ("auto", True, "direct"),   # today's default: one process hands the tensors over
    ("auto", False, "nccl"),    # ... else the placement's backend (`sync_backend`, passed in)
    ("gloo", False, "gloo"),    # named: whatever the placement
    ("nccl", False, "nccl"),
    ("direct", True, "direct"),
])
def test_the_transport_is_chosen_once_from_its_name(transport, local, want):
    assert choose_transport(transport, local, backend="nccl") == want


@pytest.mark.parametrize("transport, local, message", [
    ("direct", False, "'direct' runs only with ray.local_mode=true"),
    ("gloo", True, "'gloo' forms a process group of Ray actors"),
    ("nvlink", False, "'nvlink': expected one of auto, nccl, gloo, direct"),
])
def test_a_transport_that_cannot_run_here_is_refused_by_name(transport, local, message):
    with pytest.raises(ValueError, match=message):
        choose_transport(transport, local, backend="gloo")
