"""Weight-sync orchestration between the learner group and the engine group (the transports are swappable).

- `BroadcastSync` (Ray): learner rank 0 and every engine form a dedicated process group once; each push is one
  bucketed broadcast (gloo on CPU, NCCL on GPU), all ranks of the learner taking part in the ZeRO-3 gather.
- `DirectSync` (local mode): one process holds both, so the tensors are handed over directly.
After a push every engine's `policy_version` equals the version pushed. When an update was skipped (no group had a
signal) the weights did not change: `bump` only moves the engines' version, no bytes are sent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from shop_r1.distributed.actors import get
from shop_r1.distributed.engine_group import EngineGroup
from shop_r1.distributed.learner_group import LEARNER_TIMEOUT_S, LearnerGroup
from shop_r1.weight_sync.broadcast import SyncGroupSpec


@dataclass(frozen=True)
class SyncStats:
    seconds: float
    num_bytes: int


def bump(engines: EngineGroup, version: int) -> SyncStats:
    """The weights are unchanged since the last push: only stamp the engines with the new version."""
    start = time.perf_counter()
    engines.set_policy_version(version)
    return SyncStats(time.perf_counter() - start, 0)


class BroadcastSync:
    def __init__(self, learners: LearnerGroup, engines: EngineGroup, bucket_bytes: int, backend: str) -> None:
        self.learners, self.engines = learners, engines
        addr, port = get(learners.ranks[0].open_weight_sync_store.remote())
        spec = SyncGroupSpec(addr, port, world_size=1 + len(engines.engines), backend=backend)
        get([learners.ranks[0].init_weight_sender.remote(spec)]
            + [e.init_weight_receiver.remote(spec, i + 1) for i, e in enumerate(engines.engines)],
            timeout_s=spec.timeout_s)
        self.manifest = get(learners.ranks[0].weight_manifest.remote(bucket_bytes))

    def push(self, version: int) -> SyncStats:
        start = time.perf_counter()
        refs = [r.broadcast_weights.remote(self.manifest) for r in self.learners.ranks]
        refs += [e.receive_weights.remote(self.manifest, version) for e in self.engines.engines]
        sent = get(refs, timeout_s=LEARNER_TIMEOUT_S)[0]
        return SyncStats(time.perf_counter() - start, int(sent))

    def bump(self, version: int) -> SyncStats:
        return bump(self.engines, version)


class DirectSync:
    def __init__(self, learners: LearnerGroup, engines: EngineGroup) -> None:
        self.learners, self.engines = learners, engines

    def push(self, version: int) -> SyncStats:
        start = time.perf_counter()
        weights = list(get(self.learners.ranks[0].named_weights.remote()))
        self.engines.load_weights(weights, version)
        return SyncStats(time.perf_counter() - start, sum(t.numel() * t.element_size() for _, t in weights))

    def bump(self, version: int) -> SyncStats:
        return bump(self.engines, version)


def make_weight_sync(learners: LearnerGroup, engines: EngineGroup, bucket_bytes: int, local: bool, on_gpu: bool
                     ) -> BroadcastSync | DirectSync:
    if local:
        return DirectSync(learners, engines)
    return BroadcastSync(learners, engines, bucket_bytes, backend="nccl" if on_gpu else "gloo")
