"""Weight-sync orchestration between the learner group and the engine group (the transports are swappable).

- `BroadcastSync` (Ray): learner rank 0 and every engine form a dedicated process group once; each push is one
  bucketed broadcast (NCCL where every party holds whole GPUs, gloo otherwise: `sync_backend`), all ranks of the
  learner taking part in the ZeRO-3 gather.
- `DirectSync` (local mode): one process holds both, so the tensors are handed over directly.
After a push every engine's `policy_version` equals the version pushed. When an update was skipped (no group had a
signal) the weights did not change: `bump` only moves the engines' version, no bytes are sent.

When the engine group replaces a dead engine it calls `on_replace`: the fresh engine is not a member of the old
process group, so the broadcast group is formed again (a new store on a port the OS picks) and the last version is
pushed to every engine, or recovered from an engine that died while receiving it.
"""

from __future__ import annotations

import time

from shop_r1.distributed.actors import get, is_actor_death
from shop_r1.distributed.engine_group import EngineGroup
from shop_r1.distributed.learner_group import LEARNER_TIMEOUT_S, LearnerGroup
from shop_r1.distributed.protocols import SyncStats, WeightSync
from shop_r1.weight_sync.broadcast import SyncGroupSpec


def bump(engines: EngineGroup, version: int) -> SyncStats:
    """The weights are unchanged since the last push: only stamp the engines with the new version."""
    start = time.perf_counter()
    engines.set_policy_version(version)
    return SyncStats(time.perf_counter() - start, 0)


class BroadcastSync:
    def __init__(self, learners: LearnerGroup, engines: EngineGroup, bucket_bytes: int, backend: str) -> None:
        self.learners, self.engines, self.backend = learners, engines, backend
        self.version: int | None = None  # the last version pushed (or bumped to)
        self._connect()
        self.manifest = get(learners.ranks[0].weight_manifest.remote(bucket_bytes))
        engines.on_replace = self._after_replace

    def _connect(self) -> None:
        """Form the sync group: learner rank 0 and every current engine."""
        addr, port = get(self.learners.ranks[0].open_weight_sync_store.remote())
        spec = SyncGroupSpec(addr, port, world_size=1 + len(self.engines.engines), backend=self.backend)
        get([self.learners.ranks[0].init_weight_sender.remote(spec)]
            + [e.init_weight_receiver.remote(spec, i + 1) for i, e in enumerate(self.engines.engines)],
            timeout_s=spec.timeout_s)

    def _after_replace(self) -> None:
        self._connect()
        if self.version is not None:
            self.push(self.version)

    def push(self, version: int) -> SyncStats:
        start = time.perf_counter()
        refs = [r.broadcast_weights.remote(self.manifest) for r in self.learners.ranks]
        receivers = [e.receive_weights.remote(self.manifest, version) for e in self.engines.engines]
        try:
            sent = get(refs + receivers, timeout_s=LEARNER_TIMEOUT_S)[0]
        except Exception:  # noqa: BLE001 - an engine that died receiving is replaced, the rest re-raised
            # The first error to surface may be the sender's (gloo: "connection reset by peer") rather than the dead
            # engine's own, so ask every receiver whether its actor died before deciding.
            dead = [i for i, ref in enumerate(receivers) if _died(ref)]
            if not dead:
                raise
            for ref in refs:  # the sender sees its peer go: let its broadcast end (error) before forming a new group
                _died(ref)
            self.version = version
            for i in dead:
                self.engines.replace(i, "died while loading weights")  # -> _after_replace: new group, push again
            return SyncStats(time.perf_counter() - start, 0)
        self.version = version
        return SyncStats(time.perf_counter() - start, int(sent))

    def bump(self, version: int) -> SyncStats:
        self.version = version
        return bump(self.engines, version)


def _died(ref: object) -> bool:
    """Whether an actor call ended with its actor's death (waits for the call to end; other errors are not)."""
    try:
        get(ref, timeout_s=LEARNER_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001
        return is_actor_death(e)
    return False


class DirectSync:
    def __init__(self, learners: LearnerGroup, engines: EngineGroup) -> None:
        self.learners, self.engines = learners, engines
        self.version: int | None = None
        engines.on_replace = lambda: self.push(self.version) if self.version is not None else None

    def push(self, version: int) -> SyncStats:
        self.version = version
        start = time.perf_counter()
        weights = list(get(self.learners.ranks[0].named_weights.remote()))
        self.engines.load_weights(weights, version)
        return SyncStats(time.perf_counter() - start, sum(t.numel() * t.element_size() for _, t in weights))

    def bump(self, version: int) -> SyncStats:
        self.version = version
        return bump(self.engines, version)


def sync_backend(gpus_per_learner_rank: float, gpus_per_engine: float) -> str:
    """The broadcast group's backend, from where the actors are placed (never from the driver's hardware: under
    `ray job submit` the driver runs on the cluster's CPU-only head).

    NCCL only when learner rank 0 and every engine hold whole GPUs of their own: NCCL refuses two ranks on one card
    ("Duplicate GPU detected", seen on an H100 with fractional placement), and with fractions Ray may pack the sender
    and an engine onto the same card. Otherwise gloo, which also broadcasts CUDA tensors (through host memory)."""
    return "nccl" if gpus_per_learner_rank >= 1 and gpus_per_engine >= 1 else "gloo"


def make_weight_sync(learners: LearnerGroup, engines: EngineGroup, bucket_bytes: int, local: bool, backend: str
                     ) -> WeightSync:
    if local:
        return DirectSync(learners, engines)
    return BroadcastSync(learners, engines, bucket_bytes, backend=backend)
