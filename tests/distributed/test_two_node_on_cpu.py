"""A multi-node Ray cluster, tested on one machine (issue 22, section 4): placement by custom resources, and the loss
of the node that holds the rollout engines.

The cluster is a head (the driver's node: `trainer_node` resource) and one worker node with its own raylet
(`rollout_node` resource), both on loopback. `rollout.resources=rollout_node=0.01` places the engine on the worker;
`learner.resources` and `reward_pool.resources` (`trainer_node=0.01`) place the learner and the reward pool on the head.

What happens when the worker node is lost mid-run (its raylet and the rest of its processes killed with SIGKILL after
step 1 is logged): the engine's call fails within ~2 s (ActorUnavailableError, or ActorDiedError) during step 2's
rollout, and the engine group replaces it (rollout.max_engine_restarts). The replacement asks for `rollout_node`,
which no live node offers, so it cannot be placed. Ray alone keeps such an actor pending forever; before the
placement wait (read from the code, not run: 600 s is too long for a test) the run then sat in the weight-sync
group's 600 s timeout (`init_weight_receiver` on an engine that never starts) and failed with a bare
`ActorTimeout: actor call not done after 600.0s`, not an EngineFailure, so without the failure checkpoint. Now the
wait is bounded by `rollout.placement_timeout_s` (10 s here; ~12 s from the loss to the error), and the run stops
after checkpointing what the learner reached, with (measured):

    EngineFailure: rollout engine 0 died during generate (ActorUnavailableError); no room for {'CPU': 1.0,
    'rollout_node': 0.01} (its replacement) on the cluster within rollout.placement_timeout_s=10s; live nodes:
    9e77626c (127.0.0.1): CPU=3; gone: f8ca62ec (127.0.0.1). Bring back a node that offers the engines' resources
    (or change rollout.resources), then resume the run (--resume)

Nothing on the remaining node can take the engine (it lacks `rollout_node`), so the run does not finish by itself.
The newest checkpoint is step 1's (rl.checkpoint_every=1); step 2's rollout was lost with the engine, its update was
never made and its line never logged. Once a node offering `rollout_node` is back (`cluster.add_node`), the run
resumed with `resume=True` does steps 2 and 3: every step is logged exactly once. Not exercised here: a node that
comes back within rollout.placement_timeout_s takes the replacement at once and the run goes on without stopping;
with no `rollout.resources` the replacement goes to any live node with the CPUs, and the run goes on.

Not survived: the loss of the head node (GCS, the driver, and here the learner): the driver's connection to the
cluster ends; a rerun with --resume on a new cluster continues from the last checkpoint on shared storage.
"""

import json
import os
import threading
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from shop_r1.config import Config, ConfigError, check_ranges, load_config, parse_resources
from shop_r1.distributed.engine_group import EngineFailure
from shop_r1.learner.rank import LearnerRank
from shop_r1.rollout.vllm_engine import VLLMEngine
from shop_r1.tracking import read_metrics
from shop_r1.train import run_grpo
from tests.distributed.test_grpo_on_cpu import _cfg, _register_by_value, prompts, variety_reward  # noqa: F401

ROLLOUT, TRAINER = "rollout_node", "trainer_node"
PLACEMENT_TIMEOUT_S = 10.0


# ---------------------------------------------------------------------------------------------- the config fields


@pytest.mark.parametrize("key", ["rollout.resources", "learner.resources", "reward_pool.resources"])
def test_placement_fields_parse(key):
    section = key.split(".")[0]
    assert parse_resources(getattr(Config(), section).resources, key) == {}  # the default: no custom resources
    cfg = load_config(None, [f"{key}= rollout_node = 0.01 , zone_a=2,node:127.0.0.1=0.5"])
    assert parse_resources(getattr(cfg, section).resources, key) == {"rollout_node": 0.01, "zone_a": 2.0,
                                                                    "node:127.0.0.1": 0.5}


@pytest.mark.parametrize("value, says", [
    ("rollout_node", "is not name=amount"), ("=1", "is not name=amount"), ("a=1,", "is not name=amount"),
    ("a b=1", "is not name=amount"), ("a=0", "at least 0.0001"), ("a=-1", "at least 0.0001"),
    ("a=1e-5", "at least 0.0001"), ("a=abc", "at least 0.0001"), ("a=inf", "at least 0.0001"),
    ("a=nan", "at least 0.0001"), ("a=1.5", "whole above 1"), ("CPU=1", "not a custom resource"),
    ("a=1,a=2", "given twice"), ("1", "expected a string"),
])
def test_malformed_placement_field_names_the_key(value, says):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"learner.resources={value}"])
    assert "learner.resources" in str(err.value) and says in str(err.value), str(err.value)


def test_placement_field_checked_on_a_config_built_in_code():
    cfg = Config()
    cfg.reward_pool.resources = "trainer_node"
    with pytest.raises(ConfigError, match=r"reward_pool\.resources='trainer_node': 'trainer_node' is not name=amount"):
        check_ranges(cfg)


# ---------------------------------------------------------------------------------------------- the two-node run


def _record_node(record_dir: str, kind: str) -> None:
    """Write the node this process runs on to RECORD_DIR/<kind>-<pid> (once per process)."""
    import ray

    path = Path(record_dir) / f"{kind}-{os.getpid()}"
    if not path.exists():
        path.write_text(ray.get_runtime_context().get_node_id())


class PlacedEngine(VLLMEngine):
    """Records its node. On the node named by `hold_on_node` its second rollout call waits (until the node's loss
    kills it), so the loss lands in step 2's rollout and not, by a race, in the weight push after it."""

    record_dir = ""
    hold_on_node = ""

    def __init__(self, *args, **kwargs):
        _record_node(self.record_dir, "engine")
        super().__init__(*args, **kwargs)

    def generate(self, prompt_token_ids, spec):
        import ray

        self.rollout_calls = getattr(self, "rollout_calls", 0) + (spec.n > 1)
        if spec.n > 1 and self.rollout_calls == 2 and ray.get_runtime_context().get_node_id() == self.hold_on_node:
            time.sleep(300)
        return super().generate(prompt_token_ids, spec)


class PlacedLearner(LearnerRank):
    record_dir = ""

    def __init__(self, *args, **kwargs):
        _record_node(self.record_dir, "learner")
        super().__init__(*args, **kwargs)


class PlacedReward:
    """variety_reward, recording the reward worker's node."""

    def __init__(self, record_dir: str) -> None:
        self.record_dir = record_dir

    def __call__(self, response, target, cfg, logprobs):
        _record_node(self.record_dir, "reward")
        return variety_reward(response, target, cfg, logprobs)


def _nodes(record_dir: Path, kind: str) -> list[str]:
    return sorted(p.read_text() for p in record_dir.glob(f"{kind}-*"))


def _add_rollout_node(cluster):
    return cluster.add_node(num_cpus=1, resources={ROLLOUT: 1}, node_ip_address="127.0.0.1")


@pytest.fixture
def two_node_cluster():
    """A head (`trainer_node`) and a worker node (`rollout_node`, one CPU: one engine) on loopback, the driver
    attached through the commands' start path; every Ray process of it is stopped at the end, even on failure.
    A one-node session cluster (`ray_local_cluster`) started by an earlier test is stopped first and started again
    after: a driver talks to one cluster at a time."""
    import ray
    from ray.cluster_utils import Cluster

    from shop_r1.config import RayConfig
    from shop_r1.distributed.runtime import start_ray

    session_cpus = int(ray.cluster_resources().get("CPU", 4)) if ray.is_initialized() else 0
    ray.shutdown()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    cluster = Cluster()
    try:
        # The GCS finds a killed raylet within ~3 s (health checks every second, 3 misses) instead of ~15 s.
        cluster.add_node(num_cpus=3, resources={TRAINER: 1}, node_ip_address="127.0.0.1", include_dashboard=False,
                         object_store_memory=256 << 20,
                         _system_config={"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                                         "health_check_failure_threshold": 3})
        worker = _add_rollout_node(cluster)
        start_ray(RayConfig(address=cluster.address))
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()
        if session_cpus:
            start_ray(RayConfig(num_cpus=session_cpus))


def _remove_after_step(cluster, node, metrics: Path, step: int, stop: threading.Event, out: dict
                       ) -> threading.Thread:
    """A thread that kills `node` (SIGKILL to its raylet and the rest of its processes) once `step` is logged."""
    prefix = f'{{"step": {step},'

    def run():
        try:
            while not stop.is_set():
                text = metrics.read_text() if metrics.exists() else ""
                if any(line.startswith(prefix) for line in text.splitlines(keepends=True) if line.endswith("\n")):
                    out["removed_at"] = time.monotonic()
                    cluster.remove_node(node, allow_graceful=False)
                    return
                time.sleep(0.1)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rollout_node_lost_mid_run_stops_with_a_checkpoint_then_resumes(two_node_cluster, tiny_model_dir,
                                                                        prompts, tmp_path, capsys):  # noqa: F811
    import sys

    import ray.cloudpickle

    _register_by_value()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster, worker = two_node_cluster
    head_id, worker_id = cluster.head_node.node_id, worker.node_id
    records = tmp_path / "nodes"
    records.mkdir()
    PlacedEngine.record_dir = PlacedLearner.record_dir = str(records)
    PlacedEngine.hold_on_node = worker_id
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    cfg = _cfg(tmp_path / "run", 3)
    cfg.rollout.resources = f"{ROLLOUT}=0.01"
    cfg.learner.resources = cfg.reward_pool.resources = f"{TRAINER}=0.01"
    cfg.rollout.placement_timeout_s = PLACEMENT_TIMEOUT_S

    def run(resume: bool):
        return run_grpo(cfg, str(tiny_model_dir), prompts, tmp_path / "run" / "rl", local=False, resume=resume,
                        pad_id=pad, score_fn=PlacedReward(str(records)), engine_cls=PlacedEngine,
                        learner_cls=PlacedLearner)

    metrics = tmp_path / "run" / "metrics_grpo.jsonl"
    stop, killed = threading.Event(), {}
    killer = _remove_after_step(cluster, worker, metrics, 1, stop, killed)
    try:
        with pytest.raises(EngineFailure) as err:
            run(resume=False)
        failed_at = time.monotonic()
    finally:
        stop.set()
        killer.join(timeout=60)
    assert "error" not in killed and "removed_at" in killed, killed
    message = str(err.value)
    with capsys.disabled():  # shown with -s: what the user sees, and when
        print(f"\n[two-node] {failed_at - killed['removed_at']:.1f}s after the node's loss: EngineFailure: {message}")
    assert message.startswith("rollout engine 0 died during generate (")
    assert f"no room for {{'CPU': 1.0, '{ROLLOUT}': 0.01}} (its replacement) on the cluster within " \
           f"rollout.placement_timeout_s={PLACEMENT_TIMEOUT_S:g}s" in message
    assert f"gone: {worker_id[:8]} (127.0.0.1)" in message
    assert message.endswith("then resume the run (--resume)")
    # Bounded: the loss is seen within seconds, then the placement wait; no hang.
    assert failed_at - killed["removed_at"] < PLACEMENT_TIMEOUT_S + 60
    ckpts = tmp_path / "run" / "rl" / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_000001"
    assert [r["step"] for r in read_metrics(metrics)] == [1]

    node = _add_rollout_node(cluster)  # the rollout node is back (a new raylet, a new node id)
    result = run(resume=True)
    assert result.num_steps == 3 and (tmp_path / "run" / "rl" / "hf" / "model.safetensors").exists()
    assert "resumed from" in capsys.readouterr().out

    # Every step logged once: in the raw file and as read_metrics keeps it (the last record of a step).
    raw = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert raw == [1, 2, 3]
    logged = read_metrics(metrics)
    assert [r["step"] for r in logged] == [1, 2, 3]
    assert [r["policy_version"] for r in logged] == [0, 1, 2]
    assert [r["rollout/engine_restarts"] for r in logged] == [0, 0, 0]
    assert all(r["weight_sync/check_max_abs_logprob_diff"] < 1e-4 for r in logged)
    batches = [json.loads(x)["step"] for x in (tmp_path / "run" / "rl" / "batches.jsonl").read_text().splitlines()]
    assert batches == [1, 2, 3]

    # Placement: the engines where rollout.resources says (the first worker node, then the one that came back; the
    # replacement was never started), the learner and the reward worker of each run on the head.
    assert _nodes(records, "engine") == sorted([worker_id, node.node_id])
    assert _nodes(records, "learner") == [head_id, head_id]
    assert _nodes(records, "reward") == [head_id, head_id]
