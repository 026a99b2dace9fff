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

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

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
    zero_copy: bool = False
    """Each tensor its own broadcast, straight from the sender's tensor (no packing copy into a bucket buffer); the
    receiver still lands a bucket in one pooled buffer, each tensor at its offset (weight_sync.zero_copy)."""

    @property
    def num_bytes(self) -> int:
        return sum(_numel(m.shape) * DTYPES[m.dtype].itemsize for b in self.buckets for m in b)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# What vLLM fuses into one parameter for the Llama / Qwen2 / Mistral family (its models' `packed_modules_mapping`):
# the fused weight is the parts concatenated by rows, in this order.
PACKED_MODULES: dict[str, tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                                              "gate_up_proj": ("gate_proj", "up_proj")}
_PART_OF = {part: (fused, i) for fused, parts in PACKED_MODULES.items() for i, part in enumerate(parts)}


def fused_target(name: str) -> tuple[str, int] | None:
    """For a tensor vLLM fuses (`...self_attn.k_proj.weight`), its fused parameter's name (`...self_attn.qkv_proj.
    weight`) and its part's index (1); else None."""
    module, _, attr = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    if leaf not in _PART_OF:
        return None
    fused, index = _PART_OF[leaf]
    return f"{parent}.{fused}.{attr}" if parent else f"{fused}.{attr}", index


def fusion_order(names: Iterable[str]) -> list[str]:
    """`names` reordered so that the parts of each fused parameter follow one another in their fused order, where
    the first of them was (e.g. Qwen2's q, k, v weights together, then their biases): laid out so in one bucket, the
    parts are the fused tensor, which the engine can load without copying (shop_r1/rollout/in_place_load.py)."""
    names = list(names)
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        target = fused_target(name)
        if target is not None:
            groups.setdefault(target[0], []).append((target[1], name))
    out: list[str] = []
    placed: set[str] = set()
    for name in names:
        target = fused_target(name)
        if target is None:
            out.append(name)
        elif target[0] not in placed:
            placed.add(target[0])
            out.extend(n for _, n in sorted(groups[target[0]]))
    return out


def first_bucket_bytes(bucket_bytes: int) -> int:
    """The learners' first bucket: an eighth of the others (at least one byte). Nothing loads before the first bucket
    has been packed and has crossed the wire whole, so a small one lets the engines start loading early; the later,
    larger buckets arrive while they load (WeightReceiver posts bucket k+1 before handing out bucket k)."""
    return max(1, bucket_bytes // 8)


def make_manifest(named: Iterable[tuple[str, tuple[int, ...], torch.dtype]], bucket_bytes: int,
                  fuse: bool = False, first_bytes: int | None = None) -> Manifest:
    """Group tensors (in order) into buckets of one dtype and at most `bucket_bytes` (a bigger tensor goes alone);
    the first at most `first_bytes` where given (`first_bucket_bytes`). `fuse`: the sender pre-fuses what vLLM fuses:
    the tensors go in `fusion_order`, and the parts of one fused parameter never straddle two buckets (a group bigger
    than the bucket goes alone)."""
    entries = [(name, tuple(shape), dtype) for name, shape, dtype in named]
    if fuse:
        by_name = {e[0]: e for e in entries}
        entries = [by_name[n] for n in fusion_order(by_name)]
    buckets: list[list[TensorMeta]] = []
    size = 0
    i = 0
    while i < len(entries):
        # A fused parameter's parts (consecutive, same dtype) go into one bucket together.
        target = fused_target(entries[i][0]) if fuse else None
        j = i + 1
        while (target is not None and j < len(entries) and entries[j][2] == entries[i][2]
               and (fused_target(entries[j][0]) or ("",))[0] == target[0]):
            j += 1
        group = entries[i:j]
        key = str(entries[i][2]).removeprefix("torch.")
        nbytes = sum(_numel(shape) * dtype.itemsize for _, shape, dtype in group)
        limit = first_bytes if first_bytes is not None and len(buckets) == 1 else bucket_bytes
        if not buckets or buckets[-1][0].dtype != key or size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].extend(TensorMeta(name, shape, key) for name, shape, _ in group)
        size += nbytes
        i = j
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


def _post_broadcast(pg, flat: torch.Tensor, spec: SyncGroupSpec):
    """Start one broadcast from rank 0 (gloo and NCCL progress it on their own threads / stream); the returned
    work's `wait()` waits at most the spec's collective timeout for the peers."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor, opts.timeout = 0, 0, spec.op_timeout
    return pg.broadcast([flat], opts)


def _broadcast(pg, flat: torch.Tensor, spec: SyncGroupSpec) -> None:
    """One broadcast from rank 0, waiting at most the spec's collective timeout for the peers."""
    _post_broadcast(pg, flat, spec).wait()


class SentBytes(int):
    """The bytes a sender broadcast, carrying its phase times: `pack_s` (copying tensors into the bucket buffer)
    and `transfer_s` (waiting for the broadcast). An int, so the learners' `sent += send_bucket(...)` and `sum()`
    keep adding bytes (0 + SentBytes is a SentBytes: Python asks the subclass's __radd__ first) while the times add
    up too; learner rank 0's `broadcast_weights` hands it to the sync as it is."""

    pack_s: float
    transfer_s: float

    def __new__(cls, num_bytes: int, pack_s: float = 0.0, transfer_s: float = 0.0) -> SentBytes:
        out = super().__new__(cls, num_bytes)
        out.pack_s, out.transfer_s = pack_s, transfer_s
        return out

    def __add__(self, other: int) -> SentBytes:
        if not isinstance(other, int):
            return NotImplemented
        return SentBytes(int(self) + int(other), self.pack_s + getattr(other, "pack_s", 0.0),
                         self.transfer_s + getattr(other, "transfer_s", 0.0))

    __radd__ = __add__

    def __reduce__(self):
        return SentBytes, (int(self), self.pack_s, self.transfer_s)


@dataclass(frozen=True)
class ReceiveStats:
    """One engine's side of a sync, in seconds: `transfer_s` blocked waiting for bucket bytes (the wire not hidden
    behind loading, and the sender's gather and packing it waited for), `load_s` handing the tensors to the model's
    loader, `post_s` the rest of the reload (vLLM's layerwise set-up and finalisation, and there the CPU lm_head's
    repack; the in-place path repacks it during the load, as soon as its weight arrives), `reset_s` the prefix-cache
    reset. Their sum is the engine's whole receive. `path`: how the engine loaded
    (`in_place`, or `layerwise (why)`: rollout.weight_load)."""

    transfer_s: float = 0.0
    load_s: float = 0.0
    post_s: float = 0.0
    reset_s: float = 0.0
    path: str = ""


class WeightSender:
    """Rank 0 of the sync group, living in learner rank 0.

    Two flat buffers per dtype, each as large as the largest bucket it held yet, allocated once and reused by every
    sync: bucket k+1 is packed into one while bucket k's broadcast is still on the wire from the other (a buffer is
    packed again only once its broadcast has finished), so packing and the wire overlap."""

    def __init__(self, spec: SyncGroupSpec, device: torch.device, store=None) -> None:
        """`store`: the one `open_master_store` opened for spec.master_port; without it the store is opened here."""
        self._store, self._pg = _process_group(spec, rank=0, store=store)
        self.device, self.spec = device, spec
        self.buffers: dict[str, torch.Tensor] = {}
        """Keyed `dtype/slot` (slot 0 or 1)."""
        self._in_flight: dict[str, Any] = {}
        """The broadcast (work) each buffer is still sending, by buffer key, oldest first."""
        self._slot = 0

    def send(self, manifest: Manifest, tensors: Iterator[tuple[str, torch.Tensor]]) -> SentBytes:
        """Broadcast `tensors` (in manifest order) bucket by bucket; returns the bytes sent, every broadcast done."""
        last = len(manifest.buckets) - 1
        return sum((self.send_bucket(bucket, [next(tensors) for _ in bucket], last=k == last,
                                     zero_copy=manifest.zero_copy)
                    for k, bucket in enumerate(manifest.buckets)), SentBytes(0))

    def send_bucket(self, bucket: tuple[TensorMeta, ...], tensors: list[tuple[str, torch.Tensor]],
                    last: bool = True, zero_copy: bool = False) -> SentBytes:
        """One bucket: each tensor copied once, straight into a bucket buffer of its dtype on the sender's device (no
        upcast, no host round trip, no intermediate copies), then its broadcast started. `last`: wait for every
        broadcast still on the wire before returning (the sync's last bucket); otherwise this one may still be
        sending when the next is packed. `zero_copy` (the manifest's): each tensor broadcast from where it lies, no
        packing (a copy only where its dtype, device or layout differs from the manifest's), every broadcast of the
        bucket waited for before returning, since the caller may release the tensors (a ZeRO-3 gather). Returns the
        bytes, with the time packing and waiting for the wire."""
        if zero_copy:
            return self._send_unpacked(bucket, tensors)
        key = f"{bucket[0].dtype}/{self._slot}"
        self._slot = 1 - self._slot
        waited = self._wait(key)  # this buffer's previous broadcast must be done before it is packed again
        packing = time.perf_counter()
        flat = _buffer(self.buffers, key, bucket, self.device)
        offset = 0
        for meta, (name, t) in zip(bucket, tensors):
            if name != meta.name or tuple(t.shape) != meta.shape:
                self._wait(None)
                raise RuntimeError(f"weight sync: expected {meta.name} {meta.shape}, got {name} {tuple(t.shape)}")
            n = _numel(meta.shape)
            flat[offset:offset + n].view(meta.shape).copy_(t.detach())
            offset += n
        packed = time.perf_counter()
        self._in_flight[key] = _post_broadcast(self._pg, flat, self.spec)
        if last:
            waited += self._wait(None)
            self._slot = 0  # every sync maps its buckets to the buffers alike: no buffer grows after the first
        return SentBytes(flat.numel() * flat.element_size(), packed - packing, waited)

    def _send_unpacked(self, bucket: tuple[TensorMeta, ...], tensors: list[tuple[str, torch.Tensor]]) -> SentBytes:
        start = time.perf_counter()
        self._wait(None)  # nothing packed is still on the wire
        works, pack_s, nbytes = [], 0.0, 0
        for meta, (name, t) in zip(bucket, tensors):
            if name != meta.name or tuple(t.shape) != meta.shape:
                for work in works:
                    work.wait()
                raise RuntimeError(f"weight sync: expected {meta.name} {meta.shape}, got {name} {tuple(t.shape)}")
            packing = time.perf_counter()
            src = t.detach().to(device=self.device, dtype=DTYPES[meta.dtype]).contiguous()  # itself where it fits
            pack_s += time.perf_counter() - packing
            works.append(_post_broadcast(self._pg, src, self.spec))
            nbytes += src.numel() * src.element_size()
        for work in works:
            work.wait()
        self._slot = 0
        return SentBytes(nbytes, pack_s, (time.perf_counter() - start) - pack_s)  # the rest waited on the wire

    def _wait(self, key: str | None) -> float:
        """Wait for the broadcast from buffer `key` (None: every one in flight); returns the seconds waited."""
        start = time.perf_counter()
        for k in [k for k in self._in_flight if key is None or k == key]:
            self._in_flight.pop(k).wait()
        return time.perf_counter() - start


def _buffer(buffers: dict[str, torch.Tensor], key: str, bucket: tuple[TensorMeta, ...],
            device: torch.device) -> torch.Tensor:
    """The first numel(bucket) elements of the persistent buffer `key` (of the bucket's dtype), grown when too
    small."""
    dtype, total = bucket[0].dtype, sum(_numel(m.shape) for m in bucket)
    if key not in buffers or buffers[key].numel() < total:
        buffers[key] = torch.empty(total, dtype=DTYPES[dtype], device=device)
    return buffers[key][:total]


def _in_use(flat: torch.Tensor) -> bool:
    """Whether anything beside `flat` still holds its storage (a view the model's loader kept), judged against a
    lone tensor's count. Without the use-count hook in this torch, assume so: a fresh buffer is always safe."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return True
    probe = torch.empty(1, dtype=flat.dtype, device=flat.device)  # held by a name, as `flat` is
    return use_count(flat.untyped_storage()._cdata) > use_count(probe.untyped_storage()._cdata)


class WeightReceiver:
    """Rank r >= 1 of the sync group, living in a rollout engine's actor.

    Buckets land in a pool of persistent buffers per dtype, and the broadcast of bucket k+1 is posted before bucket
    k's tensors are handed out, so the wire runs while the model loads bucket k. A bucket takes a pooled buffer
    that nothing else references: not bucket k's, and not one whose views the model's loader still keeps (vLLM's
    layerwise reload holds a layer's first tensors until its last arrives, and a padded embedding's until the end).
    The pool grows only when none is free, so from the second sync on nothing is allocated (usually two buffers,
    three when a layer straddles buckets). `wait_s` is the time the last `receive` was blocked on the wire."""

    def __init__(self, spec: SyncGroupSpec, rank: int, device: torch.device) -> None:
        if rank < 1:
            raise ValueError("receivers have ranks 1..E; rank 0 is the learner's sender")
        self._store, self._pg = _process_group(spec, rank=rank)
        self.device, self.spec = device, spec
        self.pools: dict[str, list[torch.Tensor]] = {}
        self.wait_s = 0.0

    def _buffer(self, bucket: tuple[TensorMeta, ...]) -> torch.Tensor:
        """A free pooled buffer for `bucket` (a free one too small is replaced by a larger one), else a new one."""
        dtype, total = bucket[0].dtype, sum(_numel(m.shape) for m in bucket)
        pool = self.pools.setdefault(dtype, [])
        free = [i for i, flat in enumerate(pool) if not _in_use(flat)]
        fits = [i for i in free if pool[i].numel() >= total]
        if fits:
            return pool[fits[0]][:total]
        fresh = torch.empty(total, dtype=DTYPES[dtype], device=self.device)
        if free:
            pool[free[0]] = fresh
        else:
            pool.append(fresh)
        return fresh[:total]

    def _post(self, flat: torch.Tensor, bucket: tuple[TensorMeta, ...], zero_copy: bool) -> list[Any]:
        """Start receiving one bucket into `flat`: one broadcast, or one per tensor into its view (zero_copy)."""
        if not zero_copy:
            return [_post_broadcast(self._pg, flat, self.spec)]
        works, offset = [], 0
        for meta in bucket:
            n = _numel(meta.shape)
            works.append(_post_broadcast(self._pg, flat[offset:offset + n], self.spec))
            offset += n
        return works

    def receive(self, manifest: Manifest) -> Iterator[tuple[str, torch.Tensor]]:
        """The manifest's tensors, in order, as views into the pooled receive buffers (a buffer is never reused
        while any view of it is held, so a kept tensor keeps its values)."""
        self.wait_s = 0.0
        buckets = manifest.buckets
        if not buckets:
            return
        flat = self._buffer(buckets[0])
        works = self._post(flat, buckets[0], manifest.zero_copy)
        for k, bucket in enumerate(buckets):
            start = time.perf_counter()
            for work in works:
                work.wait()
            self.wait_s += time.perf_counter() - start
            current = flat
            if k + 1 < len(buckets):  # bucket k+1 on the wire while the loader takes bucket k
                flat = self._buffer(buckets[k + 1])
                works = self._post(flat, buckets[k + 1], manifest.zero_copy)
            offset = 0
            for meta in bucket:
                n = _numel(meta.shape)
                yield meta.name, current[offset:offset + n].view(meta.shape)
                offset += n
