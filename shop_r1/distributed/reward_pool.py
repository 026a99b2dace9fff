"""A pool of reward actors, separate from the engines, fed chunk by chunk as generations come back.

Failure handling (the contract): nothing is lost, nothing is silently zeroed.

- Every worker, at construction and after every restart, must answer `ping` within `ready_timeout_s` before it gets
  any work; one that does not is a RuntimeError (no fallback: a pool that cannot start workers cannot score).
  So a chunk's `timeout_s` only ever counts scoring time on a ready worker, never a fresh worker's start and imports.
- A response whose scorer raises gets the fallback inside the worker (`error` = "<ExceptionType>: <message>").
- A chunk not scored within `timeout_s` (a hang) or whose worker dies (a crash) is retried one response at a time on
  a ready (fresh) worker, each response with the full `timeout_s`; a response that hangs or crashes again gets the
  fallback (`error` = "timeout" / "worker crashed: <ExceptionType>"). The step goes on; the train loop decides how
  many fallbacks a step may have (reward_pool.max_failed_fraction, shop_r1/reward/failures.py).
- A chunk whose worker was replaced (for another chunk's hang or crash) before it was collected is retried the same
  way, without restarting the fresh worker again.

A call's clock starts when it is collected: collect tickets of one worker in the order they were submitted (as
`score` and EngineGroup.generate_scored do), so a chunk's budget is not spent waiting behind an earlier one.
Local mode cannot interrupt a hang (it runs in this process): use it for tests and debugging only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shop_r1.config import RewardConfig, RewardPoolConfig, parse_resources
from shop_r1.distributed.actors import ActorTimeout, Resources, get, kill, spawn
from shop_r1.reward.failures import TIMEOUT_ERROR, crash_error
from shop_r1.reward.functions import RewardTerm
from shop_r1.reward.scorer import score_response
from shop_r1.reward.worker import RewardWorker, ScoreFn, fallback_reward
from shop_r1.types import RewardBreakdown, ScoreRequest


@dataclass
class ScoreTicket:
    """A chunk in flight: which worker has it, and what it holds (kept for the retry path)."""

    ref: Any
    worker_index: int
    requests: tuple[ScoreRequest, ...]
    generation: int = 0
    """Which incarnation of the worker slot got the chunk (a slot's generation goes up each time it is replaced)."""


def _is_actor_death(e: BaseException) -> bool:
    try:
        import ray

        return isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                              ray.exceptions.OutOfMemoryError))
    except ImportError:
        return False


class RewardPool:
    def __init__(self, reward_cfg: RewardConfig, cfg: RewardPoolConfig, local: bool,
                 score_fn: ScoreFn = score_response, terms: Sequence[RewardTerm] = ()) -> None:
        if local and cfg.num_workers != 1:
            cfg = dataclasses.replace(cfg, num_workers=1)
        self._reward_cfg, self._cfg, self._local, self._score_fn = reward_cfg, cfg, local, score_fn
        self._terms = tuple(terms)  # the plug-in reward functions (shop_r1/reward/functions.py), checked by the caller
        workers = [self._spawn() for _ in range(cfg.num_workers)]
        self._wait_ready(workers)  # all start in parallel, each within ready_timeout_s
        self._workers = workers
        self._generations = [0] * len(workers)
        self._next = 0
        self.num_restarts = 0

    def _spawn(self) -> Any:
        return spawn(RewardWorker, self._reward_cfg, self._score_fn, self._terms, local=self._local,
                     resources=Resources(num_cpus=self._cfg.num_cpus_per_worker,
                                         custom=parse_resources(self._cfg.resources, "reward_pool.resources")))

    def _wait_ready(self, workers: Sequence[Any]) -> None:
        """Block until every worker answers `ping` (its start and imports done); kill them all and raise if not."""
        try:
            get([w.ping.remote() for w in workers], timeout_s=self._cfg.ready_timeout_s)
        except BaseException as e:
            for w in workers:
                kill(w)
            if isinstance(e, ActorTimeout):
                raise RuntimeError(
                    f"reward pool: {len(workers)} new reward worker(s) not ready within "
                    f"reward_pool.ready_timeout_s={self._cfg.ready_timeout_s:g}s (a worker's start and imports; "
                    f"a very loaded machine or a cluster without free CPUs for num_cpus_per_worker="
                    f"{self._cfg.num_cpus_per_worker:g}): raise reward_pool.ready_timeout_s or free resources"
                ) from e
            raise

    def submit(self, requests: Sequence[ScoreRequest]) -> ScoreTicket:
        """Send a chunk to the next worker (round robin) and return at once."""
        i = self._next
        self._next = (self._next + 1) % len(self._workers)
        return ScoreTicket(self._workers[i].score.remote(list(requests)), i, tuple(requests), self._generations[i])

    def collect(self, ticket: ScoreTicket) -> list[RewardBreakdown]:
        """The chunk's rewards, in order: scored as a chunk within `timeout_s`, or else one response at a time."""
        i = ticket.worker_index
        if ticket.generation == self._generations[i]:
            try:
                return get(ticket.ref, timeout_s=self._cfg.timeout_s)
            except ActorTimeout:
                self._replace(i)
            except Exception as e:
                if not _is_actor_death(e):
                    raise
                self._replace(i)
        # else: the worker that had this chunk was replaced (for another chunk's hang or crash) before it was
        # collected; the chunk may have died with it. The slot's current worker is fresh and ready: retry there.
        return [self._score_alone(req, i) for req in ticket.requests]

    def score(self, requests: Sequence[ScoreRequest], chunk_size: int = 64) -> list[RewardBreakdown]:
        """Score everything, spread over the workers, in order."""
        tickets = [self.submit(requests[i:i + chunk_size]) for i in range(0, len(requests), chunk_size)]
        return [r for t in tickets for r in self.collect(t)]

    def _score_alone(self, req: ScoreRequest, worker_index: int) -> RewardBreakdown:
        """One response on the slot's current (ready) worker, with the full `timeout_s`; the fallback if it fails."""
        ref = self._workers[worker_index].score.remote([req])
        try:
            return get(ref, timeout_s=self._cfg.timeout_s)[0]
        except ActorTimeout:
            self._replace(worker_index)
            return fallback_reward(TIMEOUT_ERROR)
        except Exception as e:
            if not _is_actor_death(e):
                raise
            self._replace(worker_index)
            return fallback_reward(crash_error(e))

    def _replace(self, worker_index: int) -> None:
        """Kill the slot's worker and put a fresh one in its place, returning only once the new one is ready."""
        kill(self._workers[worker_index])
        self._generations[worker_index] += 1
        self.num_restarts += 1
        fresh = self._spawn()
        self._wait_ready([fresh])
        self._workers[worker_index] = fresh

    def shutdown(self) -> None:
        for w in self._workers:
            kill(w)
