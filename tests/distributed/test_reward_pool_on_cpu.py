"""The reward pool: scores in order, and a poisoned, hanging or crashing response never kills the step."""

import os
import sys
import time

import pytest

from shop_r1.config import RewardConfig, RewardPoolConfig
from shop_r1.distributed.reward_pool import RewardPool
from shop_r1.reward.scorer import score_response
from shop_r1.types import Action, ScoreRequest

CLICK = Action("click", name="search_results.trail shoe.view_product")
GOOD = '{"rationale": "I like this one.", "action": {"type": "click", "name": "search_results.trail shoe.view_product"}}'
# Hand-computed: format 0.5 + type 0.3 + attribute 0.2 + DARS(1000) * ROUGE-L 1.0 = 1001.0
GOOD_TOTAL = 1001.0


def hostile_scorer(response, target, cfg, logprobs):
    """The real scorer, except on marker responses that raise, hang or kill the worker process."""
    if response == "POISON":
        raise RuntimeError("poisoned response")
    if response == "HANG":
        time.sleep(3600)
    if response == "CRASH":
        os._exit(1)
    return score_response(response, target, cfg, logprobs)


def _register_by_value():
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_local_pool_flags_a_poisoned_response_and_scores_the_rest():
    pool = RewardPool(RewardConfig(), RewardPoolConfig(num_workers=1), local=True, score_fn=hostile_scorer)
    rewards = pool.score([ScoreRequest(GOOD, CLICK), ScoreRequest("POISON", CLICK), ScoreRequest(GOOD, CLICK)])
    assert [r.total for r in rewards] == [GOOD_TOTAL, 0.0, GOOD_TOTAL]
    assert rewards[1].error == "RuntimeError: poisoned response"
    assert rewards[0].error is None and rewards[2].error is None


def test_ray_pool_survives_poison_hang_and_crash(ray_local_cluster):
    _register_by_value()
    pool = RewardPool(RewardConfig(), RewardPoolConfig(num_workers=2, timeout_s=5.0), local=False,
                      score_fn=hostile_scorer)
    try:
        requests = [ScoreRequest(GOOD, CLICK), ScoreRequest("POISON", CLICK), ScoreRequest("not json", CLICK),
                    ScoreRequest("HANG", CLICK), ScoreRequest(GOOD, CLICK), ScoreRequest("CRASH", CLICK),
                    ScoreRequest(GOOD, CLICK)]
        rewards = pool.score(requests, chunk_size=3)
        totals = [r.total for r in rewards]
        assert totals == [GOOD_TOTAL, 0.0, 0.0, 0.0, GOOD_TOTAL, 0.0, GOOD_TOTAL]
        assert [r.error for r in rewards] == [None, "RuntimeError: poisoned response", None, "timeout", None,
                                              rewards[5].error, None]
        assert rewards[5].error.startswith("worker crashed")
        assert rewards[2].format_valid is False  # invalid format is a score of 0, not a failure
        assert pool.num_restarts >= 3  # the hang twice (chunk, then alone), the crash at least once
        # The pool still works after the restarts.
        assert pool.score([ScoreRequest(GOOD, CLICK)])[0].total == GOOD_TOTAL
    finally:
        pool.shutdown()


@pytest.mark.parametrize("num_workers", [1, 3])
def test_ray_pool_keeps_order_across_workers(ray_local_cluster, num_workers):
    pool = RewardPool(RewardConfig(), RewardPoolConfig(num_workers=num_workers), local=False)
    try:
        names = [f"refinements.brand.b{i}" for i in range(10)]
        requests = [ScoreRequest('{"rationale": "r", "action": {"type": "click", "name": "%s"}}' % n,
                                 Action("click", name=names[0])) for n in names]
        rewards = pool.score(requests, chunk_size=3)
        # Only the first matches its target exactly; "refinements brand b1" vs "... b0": LCS 2 of 3 tokens,
        # F = 2/3 < 0.75, so no value reward: 0.5 + 0.3 + 0.2 = 1.0.
        assert [r.total for r in rewards] == [GOOD_TOTAL] + [1.0] * 9
    finally:
        pool.shutdown()
