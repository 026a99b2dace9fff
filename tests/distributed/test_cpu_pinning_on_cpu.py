"""rollout.cpu_cores / learner.cpu_cores: a pinned actor runs on its cores only, with as many OpenMP threads that wait
passively; a bad list or a core the node lacks is an error naming the key; engines and ranks may not share cores."""

from __future__ import annotations

import os

import pytest

from shop_r1.config import Config, ConfigError, cross_field_problems, load_config, parse_cpu_cores
from shop_r1.distributed.actors import Resources, get, kill, spawn


@pytest.mark.parametrize("text, cores", [("", ()), ("0", (0,)), ("0-3", (0, 1, 2, 3)), ("2,0,5-6", (0, 2, 5, 6)),
                                         (" 1 , 1 ", (1,))])
def test_cpu_lists_parse_like_taskset(text, cores):
    assert parse_cpu_cores(text, "rollout.cpu_cores") == cores


@pytest.mark.parametrize("text", ["a", "1-", "3-1", "0;1", "-1"])
def test_a_bad_cpu_list_names_the_key(text):
    with pytest.raises(ConfigError, match=r"learner\.cpu_cores="):
        parse_cpu_cores(text, "learner.cpu_cores")
    with pytest.raises(ConfigError, match=r"learner\.cpu_cores"):  # "-1" reads as a number: not a string
        load_config(None, [f"learner.cpu_cores={text}"])


def test_a_one_core_list_given_as_a_number_is_read_as_a_list():
    cfg = load_config(None, ["rollout.cpu_cores=0", "learner.cpu_cores=1"])
    assert (cfg.rollout.cpu_cores, cfg.learner.cpu_cores) == ("0", "1")


def test_engines_and_ranks_may_not_share_cores():
    cfg = Config()
    cfg.rollout.cpu_cores, cfg.learner.cpu_cores = "0-1", "1"
    assert any("share cores" in p for p in cross_field_problems(cfg))
    cfg.learner.cpu_cores = "2"
    assert cross_field_problems(cfg) == []
    cfg.rollout.cpu_cores = ""
    assert cross_field_problems(cfg) == []


class Probe:
    def facts(self) -> dict:
        import torch

        return {"cores": sorted(os.sched_getaffinity(0)), "omp": os.environ.get("OMP_NUM_THREADS"),
                "wait": os.environ.get("OMP_WAIT_POLICY"), "torch_threads": torch.get_num_threads()}


@pytest.fixture(autouse=True)
def _probe_by_value():
    import sys

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_a_pinned_actor_runs_on_its_cores_with_passive_threads(ray_local_cluster):
    core = max(os.sched_getaffinity(0))
    actor = spawn(Probe, local=False, resources=Resources(num_cpus=0, cpu_cores=(core,)))
    try:
        facts = get(actor.facts.remote(), timeout_s=120, what="the pinned probe")
    finally:
        kill(actor)
    assert facts == {"cores": [core], "omp": "1", "wait": "PASSIVE", "torch_threads": 1}


def test_a_core_the_node_lacks_is_an_error_naming_the_keys(ray_local_cluster):
    actor = spawn(Probe, local=False, resources=Resources(num_cpus=0, cpu_cores=(4095,)))
    try:
        with pytest.raises(Exception, match=r"cannot pin to CPU cores \[4095\].*rollout\.cpu_cores"):
            get(actor.facts.remote(), timeout_s=120, what="the pinned probe")
    finally:
        kill(actor)


@pytest.mark.parametrize("num_cpus, threads", [(2, 2), (0.5, 1), (0, 1)])
def test_an_unpinned_actor_runs_one_thread_per_whole_cpu_it_reserved(ray_local_cluster, num_cpus, threads):
    actor = spawn(Probe, local=False, resources=Resources(num_cpus=num_cpus))
    try:
        facts = get(actor.facts.remote(), timeout_s=120, what="the probe")
    finally:
        kill(actor)
    assert (facts["omp"], facts["torch_threads"]) == (str(threads), threads)


def test_a_reused_process_with_torch_already_imported_gets_the_reserved_threads():
    """A worker process that imported torch before (OMP_NUM_THREADS is read once, at import) is set explicitly."""
    import torch

    from shop_r1.distributed.actors import _with_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _with_threads(Probe, 1)()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
