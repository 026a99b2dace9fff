"""The engine group's fault paths with a stand-in engine (no vLLM): a hung engine is replaced after
rollout.generate_timeout_s and its prompts requeued; past rollout.max_engine_restarts the group raises EngineFailure."""

import os
import time

import pytest

from shop_r1.config import RolloutConfig
from shop_r1.distributed.engine_group import EngineFailure, EngineGroup
from shop_r1.types import Completion, Generation, SamplingSpec


class HangOnceEngine:
    """Echoes each prompt's length; the first engine to get a call (the marker file) never answers it."""

    def __init__(self, model_path, cfg, max_model_len, seed):
        self.marker = model_path  # the test passes the marker file's path as the "model"

    def generate(self, prompts, spec):
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            time.sleep(3600)
        return [Generation(i, tuple(p), tuple(Completion((len(p),), str(len(p)), (0.0,), ((0.0,),), (0,), "stop", 0)
                                             for _ in range(spec.n)), 10) for i, p in enumerate(prompts)]

    def shutdown(self):
        pass


def _register():
    import sys

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.timeout(300)
def test_hung_engine_is_replaced_and_its_prompts_requeued(ray_local_cluster, tmp_path):
    _register()
    # 12 s, not less: the replacement actor's start (a new worker process) counts against it, and under the suite's two
    # xdist workers that took more than 5 s (the requeued prompts then timed out too).
    cfg = RolloutConfig(num_engines=2, num_cpus_per_engine=0.5, generate_timeout_s=12.0, max_engine_restarts=2)
    group = EngineGroup(str(tmp_path / "hung"), cfg, 64, 0, local=False, engine_cls=HangOnceEngine)
    resynced = []
    group.on_replace = lambda: resynced.append(group.restarts)
    try:
        prompts = [[1] * n for n in (3, 5, 7, 9)]
        start = time.perf_counter()
        gens = group.generate(prompts, SamplingSpec(n=2, temperature=1.0, max_new_tokens=4, top_k_logprobs=0))
        assert time.perf_counter() - start >= 12.0  # it waited out the timeout
        assert [g.prompt_index for g in gens] == [0, 1, 2, 3]
        assert [g.completions[0].text for g in gens] == ["3", "5", "7", "9"]  # every prompt, in order
        assert group.restarts == 1 and resynced == [1]  # replaced once, then re-synced
    finally:
        group.shutdown(timeout_s=5)


@pytest.mark.timeout(300)
def test_past_max_engine_restarts_the_group_raises(ray_local_cluster, tmp_path):
    _register()
    cfg = RolloutConfig(num_engines=1, num_cpus_per_engine=0.5, generate_timeout_s=3.0, max_engine_restarts=0)
    group = EngineGroup(str(tmp_path / "hung"), cfg, 64, 0, local=False, engine_cls=HangOnceEngine)
    try:
        with pytest.raises(EngineFailure, match=r"rollout engine 0 returned nothing within "
                                                r"rollout.generate_timeout_s=3, after 0 engine restart\(s\) this run "
                                                r"\(rollout.max_engine_restarts=0\)"):
            group.generate([[1, 2]], SamplingSpec(n=1, temperature=1.0, max_new_tokens=4, top_k_logprobs=0))
    finally:
        group.shutdown(timeout_s=5)
