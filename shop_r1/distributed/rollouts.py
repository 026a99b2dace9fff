"""The rollouts of successive GRPO steps, synchronous or one-step-off (`rl.async_level`).

    async_level=0   take(t): draw step t's prompts, generate + score them with the weights of step t-1
    async_level=1   take(t): the rollout of step t (made while step t-1's update ran, by the weights of step t-2),
                    and start generating step t+1's with the engines' current weights (those of step t-1); it runs
                    while step t's update does. `push` waits for it before new weights reach the engines.

Every sample's policy lag (the learner's version before the update minus the version the engine stamped on it) is
at most `async_level`. In local mode nothing runs beside the driver: the next step's rollout is generated at once,
with the same weights and hence the same samples as under Ray. With Ray it runs in one driver thread that only
waits on engine and reward actors; the driver's thread meanwhile waits on the learner actors.

A checkpoint holds the rollout already made for the next step (`pending_bytes`), so a resumed run takes exactly
the samples the uninterrupted one did.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from shop_r1 import checkpoint
from shop_r1.data.sampler import Cursor, PromptSampler
from shop_r1.distributed.engine_group import ScoredBatch
from shop_r1.distributed.protocols import Engines, SyncStats, WeightSync
from shop_r1.distributed.reward_pool import RewardPool
from shop_r1.types import Prompt, SamplingSpec


@dataclass(frozen=True)
class StepRollout:
    step: int
    prompts: list[Prompt]
    batch: ScoredBatch
    version: int
    """The engines' policy version when generation started (the one every sample must carry)."""
    before: checkpoint.TrainState
    """The data cursor and RNG before this step's prompts were drawn; `step` is that of the last update then."""


class RolloutStream:
    def __init__(self, engines: Engines, pool: RewardPool, sampler: PromptSampler, prompts: Sequence[Prompt],
                 spec_for: Callable[[int], SamplingSpec], async_level: int, total_steps: int, local: bool,
                 version: int, pending: StepRollout | None = None) -> None:
        """`spec_for(step)`: the sampling of a step (seeded per step); `version`: the engines' weights now."""
        self.engines, self.pool, self.sampler, self.prompts = engines, pool, sampler, prompts
        self.spec_for, self.async_level, self.total_steps = spec_for, async_level, total_steps
        self.version = version
        self.push_wait_s = 0.0
        """How long the last push waited for the generation in flight."""
        self.last_before: checkpoint.TrainState | None = None
        """The state before the prompts of the rollout last started were drawn (what a checkpoint after a failed
        rollout holds)."""
        self._next: Future | None = None
        if pending is not None and async_level:
            self._next = _done(pending)
        elif pending is not None:  # a synchronous run draws its prompts again, with the weights it resumed from
            sampler.cursor = Cursor(pending.before.cursor_epoch, pending.before.cursor_position)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout") \
            if async_level and not local else None

    def _launch(self, step: int, learner_step: int) -> Future:
        """Draw step `step`'s prompts (in the driver's thread: the cursor is the driver's state) and generate + score
        them: beside the driver with async Ray, else at once."""
        self.last_before = checkpoint.TrainState(learner_step, self.sampler.cursor.epoch,
                                                 self.sampler.cursor.position, checkpoint.capture_rng())
        before, version = self.last_before, self.version
        batch_prompts = [self.prompts[i] for i in self.sampler.next_batch()]
        spec = self.spec_for(step)

        def work() -> StepRollout:
            return StepRollout(step, batch_prompts, self.engines.generate_scored(batch_prompts, spec, self.pool),
                               version, before)

        if self._thread is not None:
            self.engines.defer_resync = True  # the learner is busy: an engine replaced meanwhile is resynced later
            return self._thread.submit(work)
        out: Future = Future()
        try:
            out.set_result(work())
        except Exception as e:  # noqa: BLE001 - raised by take(), where the thread's failure is raised too
            out.set_exception(e)
        return out

    def take(self, step: int) -> StepRollout:
        """Step `step`'s rollout (the learner has made step - 1 updates); with async_level=1 also starts step + 1's."""
        current = self._next if self._next is not None else self._launch(step, step - 1)
        self._next = None
        rollout = current.result()
        if rollout.step != step:
            raise RuntimeError(f"rollout for step {rollout.step} taken at step {step} (a checkpoint from another run?)")
        if self.async_level and step < self.total_steps:
            self._next = self._launch(step + 1, step)
        return rollout

    def push(self, sync: WeightSync, version: int, changed: bool) -> SyncStats:
        """New weights (or, after an update that changed nothing, only the version) to the engines, once any
        generation in flight has finished: a rollout is made by one set of weights. A failure of that generation
        is raised here (before the push); `last_before` then holds the state to checkpoint."""
        start = time.perf_counter()
        error = self._next.exception() if self._next is not None else None
        self.engines.defer_resync = False
        if error is not None:
            self._next = None  # the learner is at `version`, unpushed: the caller's checkpoint keeps it
            raise error
        self.push_wait_s = time.perf_counter() - start if self._next is not None else 0.0
        resynced = self.engines.resync_pending
        if resynced:  # an engine was replaced during the overlap: it joins the sync group now, the learner idle
            self.engines.resync_pending = False
            if self.engines.on_replace is not None:
                self.engines.on_replace()
        synced = sync.push(version) if changed else sync.bump(version)
        self.version = version
        if resynced and self._next is not None:
            # Part of the overlapped rollout came from a fresh engine that had not had the weights: make the whole
            # rollout again, with one set of weights (those just pushed: lag 0 for that step).
            done = self._next.result()
            self._next = _done(StepRollout(done.step, done.prompts, self.engines.generate_scored(
                done.prompts, self.spec_for(done.step), self.pool), version, done.before))
        return synced

    def pending_bytes(self) -> bytes | None:
        """The next step's rollout, already made (for the checkpoint), or None."""
        if self._next is None or self._next.exception() is not None:
            return None
        return pickle.dumps(self._next.result())

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)


def load_pending(data: bytes | None) -> StepRollout | None:
    return None if data is None else pickle.loads(data)  # our own checkpoint file


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f
