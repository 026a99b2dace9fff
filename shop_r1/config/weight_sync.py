"""weight_sync: how the learner's weights reach the engines after every update, and the rule that ties the
transport to the run's local mode (`grpo_problems`)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal, Protocol

WeightSyncTransport = Literal["auto", "nccl", "gloo", "direct"]
"""weight_sync.transport: how the learner's weights reach the engines (shop_r1/distributed/sync_group.py)."""
TRANSPORTS: tuple[str, ...] = typing.get_args(WeightSyncTransport)
"""The names weight_sync.transport takes (sync_group.py reads them from here: the config package imports nothing
above it)."""


@dataclass
class WeightSyncConfig:
    transport: WeightSyncTransport = "auto"
    """How the learner's weights reach the engines after every update (shop_r1/distributed/sync_group.py):
    `auto` (default): handed over directly in ray.local_mode, else a bucketed broadcast from learner rank 0 over a
    process group of its own, NCCL where learner rank 0 and every engine hold whole GPUs of their own, gloo otherwise.
    `nccl` / `gloo`: that broadcast on the named backend, whatever the placement (NCCL needs a whole GPU per party;
    gloo also carries CUDA tensors, through host memory). `direct`: rank 0's tensors handed over in one process, so
    ray.local_mode only. A transport that cannot run where the run is placed is refused when the run starts. The
    bucket size is rl.weight_sync_bucket_mb, the deadline rollout.weight_sync_timeout_s. Changing it on resume is
    allowed: the weights the engines receive are the same."""
    zero_copy: bool = False
    """The broadcast (nccl / gloo) sends each tensor from the learner's parameter (a ZeRO-3 gather's whole tensor) as
    its own message, instead of packing a bucket's tensors into one buffer first: no packing copy on the sender, one
    message per tensor; the engine still receives a bucket into one buffer. Either way the same bytes arrive."""


class _Sections(Protocol):
    """What the transport rules read of the root Config (which imports this module)."""

    weight_sync: WeightSyncConfig


def grpo_problems(cfg: _Sections, local: bool) -> list[str]:
    """A transport that cannot run where the run is placed, named before any actor starts: DirectSync hands rank 0's
    tensors over in one process (across processes a ZeRO-3 gather needs every rank), and a broadcast group needs
    processes of its own. `local`: whether the run is in one process (run_grpo's `local`, from ray.local_mode).
    shop_r1/distributed/sync_group.py: choose_transport still refuses the same when it picks the transport."""
    transport = cfg.weight_sync.transport
    if transport not in TRANSPORTS:
        return [f"weight_sync.transport={transport!r}: expected one of {', '.join(TRANSPORTS)}"]
    if transport == "direct" and not local:
        return ["weight_sync.transport='direct' runs only with ray.local_mode=true (one process holds the learner "
                "and the engines); use auto, nccl or gloo"]
    if transport not in ("auto", "direct") and local:
        return [f"weight_sync.transport={transport!r} forms a process group of Ray actors, and ray.local_mode=true "
                "has none; use auto or direct"]
    return []
