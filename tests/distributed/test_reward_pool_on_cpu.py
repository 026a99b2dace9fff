"""The reward pool: scores in order, and a poisoned, hanging or crashing response never kills the step."""

import os
import sys
import time

import pytest

from shop_r1.config import RewardConfig, RewardPoolConfig
from shop_r1.distributed.reward_pool import RewardPool
from shop_r1.reward.failures import failure_counts
from shop_r1.reward.scorer import score_response
from shop_r1.types import Action, ScoreRequest

CLICK = Action("click", name="search_results.trail shoe.view_product")
GOOD = ('{"rationale": "I like this one.", "action": {"type": "click", '
        '"name": "search_results.trail shoe.view_product"}}')
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


def _slow_start(seconds):
    time.sleep(seconds)
    return hostile_scorer


class SlowStartScorer:
    """`hostile_scorer`, whose unpickling (in the worker's constructor) takes `seconds`: every worker, the first ones
    and each replacement, starts that slowly, as on a loaded machine where a fresh worker's start and imports take
    seconds (without burning the CPU other tests need); 3600 s: a worker that never becomes ready."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        return (_slow_start, (self.seconds,))

    def __call__(self, *args):
        return hostile_scorer(*args)


def _register_by_value():
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_local_pool_flags_a_poisoned_response_and_scores_the_rest():
    pool = RewardPool(RewardConfig(), RewardPoolConfig(num_workers=1), local=True, score_fn=hostile_scorer)
    rewards = pool.score([ScoreRequest(GOOD, CLICK), ScoreRequest("POISON", CLICK), ScoreRequest(GOOD, CLICK)])
    assert [r.total for r in rewards] == [GOOD_TOTAL, 0.0, GOOD_TOTAL]
    assert rewards[1].error == "RuntimeError: poisoned response"
    assert rewards[0].error is None and rewards[2].error is None


@pytest.mark.slow  # about a minute: 3 worker restarts of 6 s each, 2 hang timeouts of 5 s
def test_ray_pool_survives_poison_hang_and_crash(ray_local_cluster):
    # A restarted worker takes 6 s to start, more than the 5 s scoring budget: the pool must wait for it to be ready
    # before a retried response's budget starts, or a good response retried on it gets the timeout fallback.
    # (This used to be two busy-looping processes beside the test, which took two cores from every other test.)
    _register_by_value()
    pool = RewardPool(RewardConfig(), RewardPoolConfig(num_workers=2, timeout_s=5.0), local=False,
                      score_fn=SlowStartScorer(6.0))
    try:
        _poison_hang_and_crash(pool)
    finally:
        pool.shutdown()


def _poison_hang_and_crash(pool):
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
    assert failure_counts(rewards) == {"reward/num_failed": 3.0, "reward/num_failed_timeout": 1.0,
                                       "reward/num_failed_crash": 1.0, "reward/num_failed_error": 1.0}
    assert pool.num_restarts == 3  # the hang twice (chunk, then alone), the crash once (alone)
    # The pool still works after the restarts.
    assert pool.score([ScoreRequest(GOOD, CLICK)])[0].total == GOOD_TOTAL


def test_ray_pool_retries_a_chunk_lost_with_a_replaced_worker_without_restarting_again(ray_local_cluster):
    # One worker: the second chunk queues behind the hang and dies with the worker killed for it. It is re-scored on
    # the fresh (ready) worker, which is not restarted again for it.
    _register_by_value()
    pool = RewardPool(RewardConfig(), RewardPoolConfig(num_workers=1, timeout_s=3.0), local=False,
                      score_fn=hostile_scorer)
    try:
        rewards = pool.score([ScoreRequest("HANG", CLICK), ScoreRequest(GOOD, CLICK), ScoreRequest(GOOD, CLICK)],
                             chunk_size=1)
        assert [(r.total, r.error) for r in rewards] == [(0.0, "timeout"), (GOOD_TOTAL, None), (GOOD_TOTAL, None)]
        assert pool.num_restarts == 2  # the hang twice (chunk, then alone); none for the lost chunks
    finally:
        pool.shutdown()


def test_ray_pool_raises_when_a_worker_is_never_ready(ray_local_cluster):
    _register_by_value()
    with pytest.raises(RuntimeError, match=r"reward pool: .*reward_pool\.ready_timeout_s=2s"):
        RewardPool(RewardConfig(), RewardPoolConfig(num_workers=1, ready_timeout_s=2.0), local=False,
                   score_fn=SlowStartScorer(3600))


@pytest.mark.parametrize("num_workers", [1, 3])
def test_ray_pool_keeps_order_across_workers(ray_local_cluster, num_workers):
    pool = RewardPool(RewardConfig(), RewardPoolConfig(num_workers=num_workers), local=False)
    try:
        names = [f"refinements.brand.b{i}" for i in range(10)]
        requests = [ScoreRequest(f'{{"rationale": "r", "action": {{"type": "click", "name": "{n}"}}}}',
                                 Action("click", name=names[0])) for n in names]
        rewards = pool.score(requests, chunk_size=3)
        # Only the first matches its target exactly; "refinements brand b1" vs "... b0": LCS 2 of 3 tokens,
        # F = 2/3 < 0.75, so no value reward: 0.5 + 0.3 + 0.2 = 1.0.
        assert [r.total for r in rewards] == [GOOD_TOTAL] + [1.0] * 9
    finally:
        pool.shutdown()
