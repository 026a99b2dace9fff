"""Learner rank 0 -> every rollout engine, over a dedicated process group (gloo on CPU, NCCL on GPU, same code).

The group has 1 + E members: the sender (rank 0) and E engine receivers, rendezvousing on their own TCPStore, apart
from DeepSpeed's training group. Weights travel in size-bounded buckets: each bucket is flattened into one buffer of
its dtype and broadcast once, so the transfer is a few large messages whatever the number of tensors. The manifest
(names, shapes, dtypes, bucket boundaries) is small and goes through Ray ahead of the bytes.

Every wait is bounded: the rendezvous by `SyncGroupSpec.timeout_s`, each bucket's broadcast by `collective_timeout_s`
(gloo raises "Timed out waiting ..." in the party that waited; on NCCL PyTorch's watchdog ends that party's process).
The driver derives both from the bytes (shop_r1/distributed/deadlines.py) and decides who was hung.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class SyncGroupSpec:
    master_addr: str
    master_port: int
    world_size: int
    """1 sender + number of engines."""
    backend: str = "gloo"
    timeout_s: float = 600.0
    """The rendezvous: each party waits this long for the others to join."""
    collective_timeout_s: float | None = None
    """Each bucket's broadcast: a party waits this long for its peers (None: timeout_s)."""

    @property
    def op_timeout(self) -> timedelta:
        return timedelta(seconds=self.timeout_s if self.collective_timeout_s is None else self.collective_timeout_s)


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Manifest:
    buckets: tuple[tuple[TensorMeta, ...], ...]

    @property
    def num_bytes(self) -> int:
        return sum(_numel(m.shape) * DTYPES[m.dtype].itemsize for b in self.buckets for m in b)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def make_manifest(named: Iterable[tuple[str, tuple[int, ...], torch.dtype]], bucket_bytes: int) -> Manifest:
    """Group tensors (in order) into buckets of one dtype and at most `bucket_bytes` (a bigger tensor goes alone)."""
    buckets: list[list[TensorMeta]] = []
    size = 0
    for name, shape, dtype in named:
        key = str(dtype).removeprefix("torch.")
        nbytes = _numel(tuple(shape)) * dtype.itemsize
        if not buckets or buckets[-1][0].dtype != key or size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(TensorMeta(name, tuple(shape), key))
        size += nbytes
    return Manifest(tuple(tuple(b) for b in buckets))


def open_master_store(master_addr: str, timeout_s: float = 600.0):
    """The sync group's TCPStore, opened by the sender before anyone joins, on a port the OS picks while binding.

    Its `.port` goes into the SyncGroupSpec. A port picked in advance (bind to 0, close, hand it on) can be taken by
    any outgoing connection on the node before the store listens on it (seen under a busy Ray head: EADDRINUSE).
    """
    import torch.distributed as dist

    return dist.TCPStore(master_addr, 0, None, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def _process_group(spec: SyncGroupSpec, rank: int, store=None):
    import torch.distributed as dist

    if store is None:
        store = dist.TCPStore(spec.master_addr, spec.master_port, spec.world_size, is_master=rank == 0,
                              timeout=timedelta(seconds=spec.timeout_s))
    prefixed = dist.PrefixStore("shop_r1_weight_sync", store)
    if spec.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()  # as torch.distributed builds its own NCCL groups
        options._timeout = spec.op_timeout  # NCCL connects lazily, in the first broadcast: one timeout for both
        return store, dist.ProcessGroupNCCL(prefixed, rank, spec.world_size, options)
    return store, dist.ProcessGroupGloo(prefixed, rank, spec.world_size, timedelta(seconds=spec.timeout_s))


def _broadcast(pg, flat: torch.Tensor, spec: SyncGroupSpec) -> None:
    """One broadcast from rank 0, waiting at most the spec's collective timeout for the peers."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor, opts.timeout = 0, 0, spec.op_timeout
    pg.broadcast([flat], opts).wait()


class WeightSender:
    """Rank 0 of the sync group, living in learner rank 0."""

    def __init__(self, spec: SyncGroupSpec, device: torch.device, store=None) -> None:
        """`store`: the one `open_master_store` opened for spec.master_port; without it the store is opened here."""
        self._store, self._pg = _process_group(spec, rank=0, store=store)
        self.device, self.spec = device, spec

    def send(self, manifest: Manifest, tensors: Iterator[tuple[str, torch.Tensor]]) -> int:
        """Broadcast `tensors` (in manifest order) bucket by bucket; returns the bytes sent."""
        return sum(self.send_bucket(bucket, [next(tensors) for _ in bucket]) for bucket in manifest.buckets)

    def send_bucket(self, bucket: tuple[TensorMeta, ...], tensors: list[tuple[str, torch.Tensor]]) -> int:
        """One bucket: each tensor copied once, straight into one flat buffer of the bucket's dtype on the sender's
        device (no upcast, no host round trip, no intermediate copies), then one broadcast. Returns the bytes."""
        flat = torch.empty(sum(_numel(m.shape) for m in bucket), dtype=DTYPES[bucket[0].dtype], device=self.device)
        offset = 0
        for meta, (name, t) in zip(bucket, tensors):
            if name != meta.name or tuple(t.shape) != meta.shape:
                raise RuntimeError(f"weight sync: expected {meta.name} {meta.shape}, got {name} {tuple(t.shape)}")
            n = _numel(meta.shape)
            flat[offset:offset + n].view(meta.shape).copy_(t.detach())
            offset += n
        _broadcast(self._pg, flat, self.spec)
        return flat.numel() * flat.element_size()


class WeightReceiver:
    """Rank r >= 1 of the sync group, living in a rollout engine's actor."""

    def __init__(self, spec: SyncGroupSpec, rank: int, device: torch.device) -> None:
        if rank < 1:
            raise ValueError("receivers have ranks 1..E; rank 0 is the learner's sender")
        self._store, self._pg = _process_group(spec, rank=rank)
        self.device, self.spec = device, spec

    def receive(self, manifest: Manifest) -> Iterator[tuple[str, torch.Tensor]]:
        for bucket in manifest.buckets:
            total = sum(_numel(m.shape) for m in bucket)
            flat = torch.empty(total, dtype=DTYPES[bucket[0].dtype], device=self.device)
            _broadcast(self._pg, flat, self.spec)
            offset = 0
            for meta in bucket:
                n = _numel(meta.shape)
                yield meta.name, flat[offset:offset + n].view(meta.shape)
                offset += n
