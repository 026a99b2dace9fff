"""A rollout engine that hangs while receiving weights does not hang the sync: at the sync's deadline
(rollout.weight_sync_timeout_s) it is replaced like a dead engine and the weights pushed again; past
rollout.max_engine_restarts the sync raises EngineFailure naming the engine, the timeout and the key. A hung learner
step raises ActorTimeout naming the call, its timeout and learner.step_timeout_s (the drivers' restart path).

Real Ray actors, the real BroadcastSync / EngineGroup / LearnerGroup and the real gloo wire (weight_sync/broadcast.py);
the learner and the engines are stand-ins that hold a few tensors (no DeepSpeed, no vLLM).
"""

import os
import time

import pytest
import torch

from shop_r1.config import LearnerConfig, RolloutConfig
from shop_r1.distributed.engine_group import EngineFailure, EngineGroup
from shop_r1.distributed.learner_group import LearnerGroup
from shop_r1.distributed.sync_group import make_weight_sync
from shop_r1.weight_sync.broadcast import WeightReceiver, WeightSender, make_manifest, open_master_store

TIMEOUT_S = 10.0


def _weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(f"w{i}", torch.randn(64, 32, generator=g) * (i + 1)) for i in range(4)]  # 8 KiB each


class SyncLearner:
    """Learner rank 0 as the weight sync sees it: fixed tensors, sent by the real WeightSender."""

    def __init__(self, model_path, cfg, lr, total_steps, rank, world_size, seed, warmup_steps, reference_path,
                 lr_schedule="constant"):
        self.weights = _weights()

    def num_threads(self):
        return torch.get_num_threads()

    def weight_manifest(self, bucket_bytes):
        return make_manifest(((n, tuple(t.shape), t.dtype) for n, t in self.weights), bucket_bytes)

    def open_weight_sync_store(self, timeout_s=600.0):
        self._store = open_master_store("127.0.0.1", timeout_s)
        return "127.0.0.1", self._store.port

    def init_weight_sender(self, spec):
        self._sender = WeightSender(spec, torch.device("cpu"), store=self._store)

    def broadcast_weights(self, manifest):
        return self._sender.send(manifest, iter(self.weights))

    def grpo_step(self, batch, loss_cfg):
        time.sleep(3600)  # a hung update


class StallingEngine:
    """Receives with the real WeightReceiver. The engine that is receiver rank 1 when version v is pushed the first
    time (a marker file per version) sleeps in its receive far past the sync's timeout: a hung load."""

    def __init__(self, model_path, cfg, max_model_len, seed):
        self.marker, self.version, self.weights = model_path, 0, {}

    def init_weight_receiver(self, spec, rank):
        self.rank, self._receiver = rank, WeightReceiver(spec, rank, torch.device("cpu"))

    def receive_weights(self, manifest, version):
        if self.rank == 1:
            try:
                os.close(os.open(f"{self.marker}.v{version}", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                time.sleep(3600)
        self.weights = {n: t.clone() for n, t in self._receiver.receive(manifest)}
        self.version = version

    def policy_version(self):
        return self.version

    def received(self):
        return self.weights

    def pid(self):
        return os.getpid()

    def shutdown(self):
        pass


def _register():
    import sys

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _pids(engines):
    import ray

    return ray.get([e.pid.remote() for e in engines.engines], timeout=60)


@pytest.mark.timeout(180)
def test_a_stalled_weight_receive_replaces_the_engine_then_past_max_restarts_raises(ray_local_cluster, tmp_path,
                                                                                     capsys):
    _register()
    import ray

    cfg = RolloutConfig(num_engines=3, num_cpus_per_engine=0.5, max_engine_restarts=1,
                        weight_sync_timeout_s=TIMEOUT_S)
    engines = EngineGroup(str(tmp_path / "stall"), cfg, 64, 0, local=False, engine_cls=StallingEngine)
    learners = LearnerGroup("m", LearnerConfig(num_cpus_per_rank=0.5), 1e-6, 1, 0, local=False,
                            learner_cls=SyncLearner)
    try:
        sync = make_weight_sync(learners, engines, 16 << 10, local=False, backend="gloo")  # 2 buckets
        assert sync.timeouts.push_s == TIMEOUT_S and sync.timeouts.collective_s == TIMEOUT_S / 2
        before = _pids(engines)

        # Version 1: engine 0 (receiver rank 1) hangs. gloo broadcasts down a binomial tree (0 -> 2, 0 -> 1 -> 3), so
        # engine 2 (rank 3) waits on it too: its collective timeout (5 s) ends that wait before the deadline (10 s),
        # and only engine 0 is still receiving then.
        start = time.perf_counter()
        stats = sync.push(1)
        took = time.perf_counter() - start
        assert TIMEOUT_S <= took < TIMEOUT_S + 60  # waited out the one deadline, then replaced, resynced: no hang
        assert engines.restarts == 1 and stats.num_bytes == 0
        after = _pids(engines)
        assert after[0] != before[0] and after[1:] == before[1:]  # only the hung engine was replaced
        assert engines.policy_versions() == [1, 1, 1]
        want = dict(_weights())
        for got in ray.get([e.received.remote() for e in engines.engines], timeout=60):
            assert sorted(got) == sorted(want)
            for name, t in want.items():
                torch.testing.assert_close(got[name], t)  # every engine holds the learner's weights
        out = capsys.readouterr().out
        assert ("engine 0 did not finish receiving weights (version 1) within 10 s "
                "(rollout.weight_sync_timeout_s=10): replaced by a fresh engine (restart 1 of at most 1)") in out

        # Version 2: the fresh engine 0 hangs too, past rollout.max_engine_restarts: EngineFailure, within the
        # deadline (and the recovery's bounded wait for the sender), not a hang.
        start = time.perf_counter()
        with pytest.raises(EngineFailure) as err:
            sync.push(2)
        assert time.perf_counter() - start < TIMEOUT_S + 30
        assert str(err.value) == ("rollout engine 0 did not finish receiving weights (version 2) within 10 s "
                                  "(rollout.weight_sync_timeout_s=10), after 1 engine restart(s) this run "
                                  "(rollout.max_engine_restarts=1)")
    finally:
        engines.shutdown(timeout_s=5)
        learners.shutdown()


@pytest.mark.timeout(120)
def test_a_hung_learner_step_raises_actor_timeout_naming_the_key(ray_local_cluster):
    _register()
    from types import SimpleNamespace

    from shop_r1.distributed.actors import ActorTimeout, is_actor_death

    learners = LearnerGroup("m", LearnerConfig(num_cpus_per_rank=0.5, step_timeout_s=2.0), 1e-6, 1, 0, local=False,
                            learner_cls=SyncLearner)
    try:
        batch = SimpleNamespace(num_responses=2, input_ids=torch.zeros(2, 8, dtype=torch.long))  # 16 tokens
        start = time.perf_counter()
        with pytest.raises(ActorTimeout) as err:
            learners.grpo_step(batch, loss_cfg=None)
        assert time.perf_counter() - start < 30
        assert str(err.value) == ("learner grpo_step on 1 rank(s), 16 tokens per rank (learner.step_timeout_s=2): "
                                  "not done within 2 s")
        assert is_actor_death(err.value)  # run_grpo / run_sft: tear down, resume from the last checkpoint
    finally:
        learners.shutdown()
