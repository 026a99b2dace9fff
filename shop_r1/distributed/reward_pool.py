"""A pool of reward actors, separate from the engines, fed chunk by chunk as generations come back.

Failure handling (the contract): a response whose scorer raises gets the fallback inside the worker. A chunk that is
not scored within `timeout_s` (a hang) or whose worker dies (a crash) is retried one response at a time on a fresh
worker; a response that hangs or crashes again gets the fallback (`error` = "timeout" / the crash). The step goes on.
Local mode cannot interrupt a hang (it runs in this process): use it for tests and debugging only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from shop_r1.config import RewardConfig, RewardPoolConfig
from shop_r1.distributed.actors import ActorTimeout, Resources, get, kill, spawn
from shop_r1.reward.worker import RewardWorker, ScoreFn, fallback_reward
from shop_r1.reward.scorer import score_response
from shop_r1.types import RewardBreakdown, ScoreRequest


@dataclass
class ScoreTicket:
    """A chunk in flight: which worker has it, and what it holds (kept for the retry path)."""

    ref: Any
    worker_index: int
    requests: tuple[ScoreRequest, ...]


def _is_actor_death(e: BaseException) -> bool:
    try:
        import ray

        return isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError))
    except ImportError:
        return False


class RewardPool:
    def __init__(self, reward_cfg: RewardConfig, cfg: RewardPoolConfig, local: bool,
                 score_fn: ScoreFn = score_response) -> None:
        if local and cfg.num_workers != 1:
            cfg = RewardPoolConfig(num_workers=1, timeout_s=cfg.timeout_s, num_cpus_per_worker=cfg.num_cpus_per_worker)
        self._reward_cfg, self._cfg, self._local, self._score_fn = reward_cfg, cfg, local, score_fn
        self._workers = [self._spawn() for _ in range(cfg.num_workers)]
        self._next = 0
        self.num_restarts = 0

    def _spawn(self) -> Any:
        return spawn(RewardWorker, self._reward_cfg, self._score_fn, local=self._local,
                     resources=Resources(num_cpus=self._cfg.num_cpus_per_worker))

    def submit(self, requests: Sequence[ScoreRequest]) -> ScoreTicket:
        """Send a chunk to the next worker (round robin) and return at once."""
        i = self._next
        self._next = (self._next + 1) % len(self._workers)
        return ScoreTicket(self._workers[i].score.remote(list(requests)), i, tuple(requests))

    def collect(self, ticket: ScoreTicket) -> list[RewardBreakdown]:
        try:
            return get(ticket.ref, timeout_s=self._cfg.timeout_s)
        except ActorTimeout:
            self._replace(ticket.worker_index)
        except Exception as e:
            if not _is_actor_death(e):
                raise
            self._replace(ticket.worker_index)
        return [self._score_alone(req, ticket.worker_index) for req in ticket.requests]

    def score(self, requests: Sequence[ScoreRequest], chunk_size: int = 64) -> list[RewardBreakdown]:
        """Score everything, spread over the workers, in order."""
        tickets = [self.submit(requests[i:i + chunk_size]) for i in range(0, len(requests), chunk_size)]
        return [r for t in tickets for r in self.collect(t)]

    def _score_alone(self, req: ScoreRequest, worker_index: int) -> RewardBreakdown:
        ref = self._workers[worker_index].score.remote([req])
        try:
            return get(ref, timeout_s=self._cfg.timeout_s)[0]
        except ActorTimeout:
            self._replace(worker_index)
            return fallback_reward("timeout")
        except Exception as e:
            if not _is_actor_death(e):
                raise
            self._replace(worker_index)
            return fallback_reward(f"worker crashed: {type(e).__name__}")

    def _replace(self, worker_index: int) -> None:
        kill(self._workers[worker_index])
        self._workers[worker_index] = self._spawn()
        self.num_restarts += 1

    def shutdown(self) -> None:
        for w in self._workers:
            kill(w)
