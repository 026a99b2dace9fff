"""Weight-sync orchestration between the learner group and the engine group (the transports are swappable, chosen
once by `make_weight_sync` from `weight_sync.transport`; the wire itself, sender and receiver, is
shop_r1/weight_sync/broadcast.py).

- `BroadcastSync` (Ray): learner rank 0 and every engine form a dedicated process group once; each push is one
  bucketed broadcast (NCCL where every party holds whole GPUs, gloo otherwise: `sync_backend`), all ranks of the
  learner taking part in the ZeRO-3 gather.
- `DirectSync` (local mode): one process holds both, so the tensors are handed over directly.
After a push every engine's `policy_version` equals the version pushed. When an update was skipped (no group had a
signal) the weights did not change: `bump` only moves the engines' version, no bytes are sent.

When the engine group replaces a dead engine it calls `on_replace`: the fresh engine is not a member of the old
process group, so the broadcast group is formed again (a new store on a port the OS picks) and the last version is
pushed to every engine, or recovered from an engine that died while receiving it.

Every wait is bounded (shop_r1/distributed/deadlines.py). A push has one deadline for the whole sync, whatever the
number of engines: `rollout.weight_sync_timeout_s` (0: 300 s + bytes / 50 MB/s); each bucket's broadcast inside it
waits at most half of it. At the deadline:
- An engine whose receive has not ended is hung. It is killed (its connections close, so a broadcast waiting on it
  ends at once), then replaced like an engine that died while receiving (`EngineGroup.replace`: at most
  rollout.max_engine_restarts, then EngineFailure, which `shop-r1 train` checkpoints before stopping). Once every
  failed engine is replaced the group is formed again and the version pushed again: a new sync, its own deadline.
- The parties a hung engine held up are not replaced. gloo broadcasts down a binomial tree, so the sender and the
  engines below the hung one wait for it; their collective timeout (half the deadline) ends that wait with an error
  before the deadline, and they join the new group. (Held up by a stall in the deadline's second half, an engine is
  still waiting at the deadline and is replaced too: one more restart, the same weights. On NCCL PyTorch's watchdog
  ends the process of a party whose collective timed out: those held up die, and are replaced as dead engines.)
- Learner rank 0's broadcast not ended (with every engine done, or still going a collective timeout after the hung
  engines were killed): the learner is hung. ActorTimeout naming it, which the drivers handle as a learner death
  (rl.max_restarts: actors torn down, the run resumes from its last checkpoint).
- A learner rank died: its death is raised (the same restart path), whatever the engines did meanwhile.
- Every call ended, with errors, and no engine hung or died (a party raised; a network fault timed out every
  collective): WeightSyncError, an EngineFailure: `shop-r1 train` checkpoints the learner's update and stops.
"""

from __future__ import annotations

import dataclasses
import time

from shop_r1.config import TRANSPORTS, Config, ConfigError
from shop_r1.distributed import deadlines
from shop_r1.distributed.actors import ActorTimeout, get, is_actor_death, kill, wait_all
from shop_r1.distributed.engine_group import EngineFailure, EngineGroup
from shop_r1.distributed.protocols import LearnerWeights, SyncStats, WeightSync
from shop_r1.weight_sync.broadcast import ReceiveStats, SyncGroupSpec


class WeightSyncError(EngineFailure):
    """A push failed with no engine to replace: a party raised, or every collective timed out (a network fault)."""


def bump(engines: EngineGroup, version: int) -> SyncStats:
    """The weights are unchanged since the last push: only stamp the engines with the new version."""
    start = time.perf_counter()
    engines.set_policy_version(version)
    return SyncStats(time.perf_counter() - start, 0)


class BroadcastSync:
    def __init__(self, learners: LearnerWeights, engines: EngineGroup, bucket_bytes: int, backend: str,
                 zero_copy: bool = False) -> None:
        self.learners, self.engines, self.backend = learners, engines, backend
        self.version: int | None = None  # the last version pushed (or bumped to)
        override = engines.cfg.weight_sync_timeout_s
        manifest = get(learners.weight_manifest(bucket_bytes),
                       timeout_s=deadlines.weight_sync_timeouts(0, override).push_s,
                       what=f"learner rank 0's weight manifest ({self._key()})")
        self.manifest = dataclasses.replace(manifest, zero_copy=zero_copy)  # weight_sync.zero_copy
        self.timeouts = deadlines.weight_sync_timeouts(self.manifest.num_bytes, override)
        self._connect()
        engines.on_replace = self._after_replace

    def _key(self) -> str:
        return deadlines.explain("rollout.weight_sync_timeout_s", self.engines.cfg.weight_sync_timeout_s)

    def _connect(self) -> None:
        """Form the sync group: learner rank 0 and every current engine, once every engine has started (a fresh
        engine loads its model first: the engines' start timeout, not the sync's)."""
        engines, t = self.engines.engines, self.timeouts
        get([e.policy_version.remote() for e in engines], timeout_s=self.engines.start_timeout_s,
            what=f"{len(engines)} rollout engine(s) starting, before the weight-sync group forms (an engine's start "
                 "timeout: shop_r1/distributed/deadlines.py)")
        addr, port = get(self.learners.open_weight_sync_store(t.collective_s), timeout_s=t.push_s,
                         what=f"learner rank 0 opening the weight-sync store ({self._key()})")
        spec = SyncGroupSpec(addr, port, world_size=1 + len(engines), backend=self.backend,
                             timeout_s=t.collective_s, collective_timeout_s=t.collective_s)
        get([self.learners.init_weight_sender(spec)]
            + [e.init_weight_receiver.remote(spec, i + 1) for i, e in enumerate(engines)],
            timeout_s=t.push_s, what=f"the weight-sync group's rendezvous ({self._key()})")

    def _after_replace(self) -> None:
        self._connect()
        if self.version is not None:
            self.push(self.version)

    def push(self, version: int) -> SyncStats:
        """`version`'s weights to every engine within one deadline; hung or dead engines are replaced and the push
        made again (the module's docstring says who counts as hung)."""
        start, t = time.perf_counter(), self.timeouts
        senders = self.learners.broadcast_weights(self.manifest)
        receivers = [e.receive_weights.remote(self.manifest, version) for e in self.engines.engines]
        ended = set(wait_all(senders + receivers, t.push_s))  # the one deadline of the whole sync
        lost = [ref for ref in senders if ref in ended and _died(ref, t.push_s)]
        if lost:  # the learner died (its receivers fail with it): its death, for the drivers' restart path
            get(lost, timeout_s=t.push_s)
        hung = {i: f"did not finish receiving weights (version {version}) within {t.push_s:g} s ({self._key()})"
                for i, ref in enumerate(receivers) if ref not in ended}
        dead = {i: "died while loading weights" for i, ref in enumerate(receivers)
                if ref in ended and _died(ref, t.push_s)}
        if hung or dead:
            self._recover(hung, dead, senders, version)
            return SyncStats(time.perf_counter() - start, 0)
        busy = [rank for rank, ref in enumerate(senders) if ref not in ended]
        if busy:
            raise ActorTimeout(f"weight sync of version {version}: learner rank(s) {busy} still broadcasting after "
                               f"{t.push_s:g} s, every engine done ({self._key()}): the learner is hung")
        try:
            results = get(senders + receivers, timeout_s=t.push_s)  # all ended: returns, or raises, at once
        except Exception as e:  # noqa: BLE001 - re-raised with what the sync knows
            raise WeightSyncError(f"weight sync of version {version} failed, and no engine hung or died to be "
                                  f"replaced: {_last_line(e)} (each bucket's broadcast waits at most "
                                  f"{t.collective_s:g} s, half of {self._key()})") from e
        self.version = version
        return phases(time.perf_counter() - start, results[0], results[len(senders):])

    def _recover(self, hung: dict[int, str], dead: dict[int, str], senders: list, version: int) -> None:
        """Kill the hung engines (a broadcast still waiting on one then ends), let the learner's broadcast end, then
        replace the hung and the dead ({engine index: reason}) and push again, once."""
        for i in hung:
            kill(self.engines.engines[i])
        failed = {**hung, **dead}
        ended = set(wait_all(senders, self.timeouts.collective_s))  # their errors are the engines' (connection lost)
        busy = [rank for rank, ref in enumerate(senders) if ref not in ended]
        if busy:
            raise ActorTimeout(f"weight sync of version {version}: learner rank(s) {busy} still broadcasting "
                               f"{self.timeouts.collective_s:g} s after the failed engine(s) {sorted(failed)} were "
                               f"stopped ({self._key()}): the learner is hung")
        self.version = version
        deferred, self.engines.defer_resync = self.engines.defer_resync, True
        try:
            for i, reason in sorted(failed.items()):
                self.engines.replace(i, reason)
        finally:
            self.engines.defer_resync = deferred
        if not deferred:  # one new group and one push for all the replacements
            self.engines.resync_pending = False
            self._after_replace()

    def bump(self, version: int) -> SyncStats:
        self.version = version
        return bump(self.engines, version)


def _died(ref: object, timeout_s: float) -> bool:
    """Whether a call that has ended ended with its actor's death (other errors are not)."""
    try:
        get(ref, timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001
        return is_actor_death(e)
    return False


def _last_line(error: BaseException) -> str:
    """The line that names the error (a Ray task error's last line, after the remote traceback)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(error).__name__


def phases(seconds: float, sent: object, received: list) -> SyncStats:
    """A push's phases along the slowest engine's path (its `ReceiveStats`), so they add up to its receive and never
    to more than `seconds`. The engine's wait for bytes covers learner rank 0's packing (its `SentBytes`) as well as
    the wire: pack is the sender's packing up to that wait (packing hidden behind loading is off the path), transfer
    the rest of the wait. Backends that return plain bytes and None (test doubles) give zero phases."""
    slowest = max((r for r in received if isinstance(r, ReceiveStats)), default=ReceiveStats(),
                  key=lambda r: r.transfer_s + r.load_s + r.post_s + r.reset_s)
    pack_s = min(getattr(sent, "pack_s", 0.0), slowest.transfer_s)
    return SyncStats(seconds, int(sent), pack_s=pack_s, transfer_s=slowest.transfer_s - pack_s,
                     load_s=slowest.load_s, post_s=slowest.post_s, reset_s=slowest.reset_s, load_path=slowest.path)


class DirectSync:
    def __init__(self, learners: LearnerWeights, engines: EngineGroup) -> None:
        self.learners, self.engines = learners, engines
        self.version: int | None = None
        engines.on_replace = lambda: self.push(self.version) if self.version is not None else None

    def push(self, version: int) -> SyncStats:
        self.version = version
        start = time.perf_counter()
        weights = list(get(self.learners.named_weights(), timeout_s=deadlines.weight_sync_timeouts(
            0, self.engines.cfg.weight_sync_timeout_s).push_s, what="learner rank 0's weights"))  # local: no wait
        gathered = time.perf_counter()
        self.engines.load_weights(weights, version)  # the engine group's call: load, post and reset in one
        end = time.perf_counter()
        return SyncStats(end - start, sum(t.numel() * t.element_size() for _, t in weights), pack_s=gathered - start,
                         load_s=end - gathered)

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


def choose_transport(transport: str, local: bool, backend: str) -> str:
    """"direct", "nccl" or "gloo": `transport` (weight_sync.transport, one of config.TRANSPORTS: "nccl" or "gloo",
    BroadcastSync's group on that backend; "direct", DirectSync; "auto", DirectSync in local mode, else `backend`,
    `sync_backend`'s choice from the placement) for this run. A transport that cannot run here is a ConfigError
    naming the key: DirectSync hands rank 0's tensors over in one process (across processes a ZeRO-3 gather needs
    every rank), and a broadcast group needs processes of its own. Checked here, not when the config loads: whether
    the run is local is the caller's to say (`run_grpo`'s `local`)."""
    if transport == "auto":
        return "direct" if local else backend
    if transport not in TRANSPORTS:
        raise ConfigError(f"weight_sync.transport={transport!r}: expected one of {', '.join(TRANSPORTS)}")
    if transport == "direct" and not local:
        raise ConfigError("weight_sync.transport='direct' runs only with ray.local_mode=true (one process holds the "
                          "learner and the engines); use auto, nccl or gloo")
    if transport != "direct" and local:
        raise ConfigError(f"weight_sync.transport={transport!r} forms a process group of Ray actors, and "
                          "ray.local_mode=true has none; use auto or direct")
    return transport


def make_weight_sync(learners: LearnerWeights, engines: EngineGroup, bucket_bytes: int, local: bool, backend: str,
                     transport: str = "auto", zero_copy: bool = False) -> WeightSync:
    """The run's weight sync, the transport chosen here once (`choose_transport`), and said on the console."""
    chosen = choose_transport(transport, local, backend)
    if chosen == "direct":
        return DirectSync(learners, engines)
    sync = BroadcastSync(learners, engines, bucket_bytes, backend=chosen, zero_copy=zero_copy)
    how = "one broadcast per tensor, from the parameters" if zero_copy else "one broadcast per packed bucket"
    print(f"  weight sync: bucketed {chosen} broadcast from learner rank 0 to the engines ({how})", flush=True)
    return sync


def weight_sync_from_config(cfg: Config, learners: LearnerWeights, engines: EngineGroup, local: bool) -> WeightSync:
    """The GRPO driver's weight sync: weight_sync.transport, rl.weight_sync_bucket_mb, and the backend the actors'
    placement allows (`sync_backend`: learner.num_gpus_per_rank, rollout.num_gpus_per_engine), which "auto" takes."""
    backend = sync_backend(cfg.learner.num_gpus_per_rank, cfg.rollout.num_gpus_per_engine)
    return make_weight_sync(learners, engines, cfg.rl.weight_sync_bucket_mb << 20, local, backend,
                            cfg.weight_sync.transport, cfg.weight_sync.zero_copy)
