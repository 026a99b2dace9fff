"""Learner rank 0's end of the broadcast weight sync (shop_r1/weight_sync/broadcast.py), the same for every backend:
the sync group's store, opened on rank 0 before the engines join, and the sender on it. A backend adds only how the
parameters of one bucket are gathered whole on every rank (its `weight_manifest` and `broadcast_weights`).
"""

from __future__ import annotations

from typing import Any

import torch

from shop_r1.weight_sync.broadcast import SentBytes, SyncGroupSpec, TensorMeta, WeightSender, open_master_store


class LearnerSender:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._store: Any = None
        self._sender: WeightSender | None = None

    def open_store(self, timeout_s: float) -> tuple[str, int]:
        """Rank 0 opens the sync group's store on a port the OS picks; returns (this node's address, the port)."""
        if self.rank != 0:
            raise RuntimeError("the weight-sync store lives on learner rank 0")
        import ray

        addr = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        self._store = open_master_store(addr, timeout_s)
        return addr, self._store.port

    def connect(self, spec: SyncGroupSpec, device: torch.device) -> None:
        """Rank 0 joins the sync group (on the store `open_store` opened, else on one it opens); others do nothing."""
        if self.rank == 0:
            self._sender = WeightSender(spec, device, store=self._store)

    def send_bucket(self, bucket: tuple[TensorMeta, ...], tensors: list[tuple[str, torch.Tensor]],
                    last: bool = True, zero_copy: bool = False) -> SentBytes:
        """Rank 0 broadcasts one bucket's gathered tensors (copied out before returning, so the gather may be
        released) and returns the bytes, with its packing and broadcast-wait times (`SentBytes`: the backend's
        `sent += ...` adds them up); `last`: the sync's last bucket (every broadcast finished on return); `zero_copy`:
        the manifest's (each tensor broadcast from where it lies). The other
        ranks, which only joined the gather, send nothing (0)."""
        if self.rank != 0:
            return SentBytes(0)
        return self._sender.send_bucket(bucket, tensors, last=last, zero_copy=zero_copy)
