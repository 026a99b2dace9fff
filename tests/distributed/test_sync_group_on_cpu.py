"""The GRPO driver's weight sync is built from the config: weight_sync.transport and rl.weight_sync_bucket_mb reach
`make_weight_sync`, and a transport that cannot run where the run is placed is a ConfigError naming the key. Fakes
stand in for the groups: no Ray, no model."""

import pytest

from shop_r1 import config
from shop_r1.config import Config, ConfigError, load_config
from shop_r1.distributed import sync_group
from shop_r1.distributed.sync_group import DirectSync, weight_sync_from_config


class FakeEngines:
    on_replace = None


class RecordedBroadcast:
    """Stands in for BroadcastSync (which would form a process group): records what it was built with."""

    def __init__(self, learners, engines, bucket_bytes, backend, zero_copy=False):
        self.learners, self.engines, self.bucket_bytes, self.backend = learners, engines, bucket_bytes, backend
        self.zero_copy = zero_copy


@pytest.fixture
def recorded(monkeypatch):
    monkeypatch.setattr(sync_group, "BroadcastSync", RecordedBroadcast)


GPU = ["learner.num_gpus_per_rank=1", "rollout.num_gpus_per_engine=1"]  # whole GPUs per party: "auto" takes NCCL


@pytest.mark.parametrize("overrides, backend", [
    (GPU, "nccl"),                                        # auto: the placement's backend
    ([*GPU, "weight_sync.transport=gloo"], "gloo"),       # named: whatever the placement
    (["weight_sync.transport=nccl"], "nccl"),
    ([], "gloo"),                                         # auto on CPU
])
def test_the_configured_transport_and_bucket_reach_the_sync(recorded, overrides, backend, capsys):
    cfg = load_config(None, [*overrides, "rl.weight_sync_bucket_mb=3"])
    learners, engines = object(), FakeEngines()
    sync = weight_sync_from_config(cfg, learners, engines, local=False)
    assert isinstance(sync, RecordedBroadcast)
    assert (sync.learners, sync.engines, sync.backend, sync.bucket_bytes) == (learners, engines, backend, 3 << 20)
    assert sync.zero_copy is False
    assert f"weight sync: bucketed {backend} broadcast from learner rank 0 to the engines" in capsys.readouterr().out


def test_weight_sync_zero_copy_reaches_the_sync(recorded, capsys):
    cfg = load_config(None, ["weight_sync.zero_copy=true"])
    sync = weight_sync_from_config(cfg, object(), FakeEngines(), local=False)
    assert isinstance(sync, RecordedBroadcast) and sync.zero_copy is True
    assert "(one broadcast per tensor, from the parameters)" in capsys.readouterr().out


@pytest.mark.parametrize("transport", ["auto", "direct"])
def test_local_mode_hands_the_tensors_over(recorded, transport):
    cfg = load_config(None, [f"weight_sync.transport={transport}"])
    assert isinstance(weight_sync_from_config(cfg, object(), FakeEngines(), local=True), DirectSync)


@pytest.mark.parametrize("transport, local, message", [
    ("direct", False, "weight_sync.transport='direct' runs only with ray.local_mode=true"),
    ("gloo", True, "weight_sync.transport='gloo' forms a process group of Ray actors, and ray.local_mode=true has "
                   "none; use auto or direct"),
])
def test_a_transport_that_cannot_run_here_is_a_config_error(recorded, transport, local, message):
    cfg = load_config(None, [f"weight_sync.transport={transport}"])
    with pytest.raises(ConfigError) as err:
        weight_sync_from_config(cfg, object(), FakeEngines(), local=local)
    assert message in str(err.value)


def test_a_transport_set_in_code_is_checked_by_name(recorded):
    cfg = Config()
    cfg.weight_sync.transport = "nvlink"  # a Config edited in code skips the load-time Literal check
    with pytest.raises(ConfigError, match=r"weight_sync\.transport='nvlink': expected one of auto, nccl, gloo, direct"):
        weight_sync_from_config(cfg, object(), FakeEngines(), local=False)


def test_the_names_come_from_the_config():
    assert sync_group.TRANSPORTS is config.TRANSPORTS
