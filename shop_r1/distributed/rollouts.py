"""The rollouts of successive GRPO steps, synchronous or one-step-off (`rl.async_level`).

    async_level=0   take(t): draw step t's prompts, generate + score them with the weights of step t-1
    async_level=1   take(t): the rollout of step t (made while step t-1's update ran, by the weights of step t-2),
                    and start generating step t+1's with the engines' current weights (those of step t-1); it runs
                    while step t's update does. `push` waits for it before new weights reach the engines.

Every sample's policy lag (the learner's version before the update minus the version the engine stamped on it) is
at most `async_level`. In local mode nothing runs beside the driver: the next step's rollout is generated at once,
with the same weights and hence the same samples as under Ray. With Ray it runs in one driver thread that only
waits on engine and reward actors; the driver's thread meanwhile waits on the learner actors.

A checkpoint holds the rollout already made for the next step (`pending_bytes`, the file PENDING_FILE), so a
resumed run takes exactly the samples the uninterrupted one did. It is JSON, not pickle: checkpoints live on shared
storage that others can write to, and unpickling a file runs whatever code it names. Loading builds only the record
types StepRollout's annotations name, checking every field; floats round-trip exactly (repr), NaN and infinities
included.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
import types
import typing
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from shop_r1 import checkpoint
from shop_r1.data.sampler import Cursor, PromptSampler
from shop_r1.distributed.engine_group import ScoredBatch
from shop_r1.distributed.protocols import Engines, SyncStats, WeightSync
from shop_r1.distributed.reward_pool import RewardPool
from shop_r1.types import Prompt, SamplingSpec

PENDING_FILE = "pending_rollout.json"
"""The checkpoint file of the next step's rollout (rl.async_level=1); train.PENDING_ROLLOUT names the same."""
_FORMAT, _VERSION = "shop-r1 pending rollout", 1


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
        return encode_pending(self._next.result())

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)


class PendingRolloutError(ValueError):
    """A pending-rollout file that this code did not write (damaged, replaced, from another version)."""


def encode_pending(rollout: StepRollout) -> bytes:
    """The JSON of a StepRollout: records as objects of their fields, tuples as lists, numpy arrays as lists."""
    def plain(obj: Any) -> Any:  # called by json for what it cannot write itself
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        if isinstance(obj, np.ndarray | np.generic):
            return obj.tolist()
        raise TypeError(f"pending rollout: cannot write a {type(obj).__name__}")

    return json.dumps({"format": _FORMAT, "version": _VERSION, "rollout": rollout}, default=plain,
                      separators=(",", ":")).encode()


def load_pending(data: bytes | None, where: str | Path = PENDING_FILE) -> StepRollout | None:
    """The rollout `pending_bytes` wrote, or None for no data. PendingRolloutError naming `where` (the file) for
    anything else: no code runs and no type other than StepRollout's fields' is built."""
    if data is None:
        return None
    try:
        payload = json.loads(data)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError (e.g. an old pending_rollout.pkl)
        raise PendingRolloutError(f"{where}: not a pending rollout ({type(e).__name__}: {e})") from None
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT or payload.get("version") != _VERSION:
        found = {k: payload.get(k) for k in ("format", "version")} if isinstance(payload, dict) else payload
        raise PendingRolloutError(f"{where}: not a pending rollout of format {_FORMAT!r} version {_VERSION} "
                                  f"(found {str(found)[:200]})")
    return _decode(StepRollout, payload.get("rollout"), f"{where}: rollout")


def _decode(hint: Any, value: Any, at: str) -> Any:
    """`value` (decoded JSON) as type `hint` (a field annotation), checked all the way down."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is checkpoint.TrainState:
        return _decode_train_state(value, at)
    if dataclasses.is_dataclass(hint):
        names = [f.name for f in dataclasses.fields(hint)]
        if not isinstance(value, dict) or set(value) != set(names):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise PendingRolloutError(f"{at}: expected a {hint.__name__} with fields {names}, got {got}")
        hints = _type_hints(hint)
        return hint(**{n: _decode(hints[n], value[n], f"{at}.{n}") for n in names})
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]  # our records only use `X | None`
        return _decode(inner, value, at)
    if origin is Literal:
        if value not in args:
            raise PendingRolloutError(f"{at}: expected one of {args}, got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise PendingRolloutError(f"{at}: expected a list, got {type(value).__name__}")
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise PendingRolloutError(f"{at}: expected {len(args)} items, got {len(value)}")
            return tuple(_decode(a, v, f"{at}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        item = args[0]
        if item in (int, float, str, bool):  # the long lists (token ids, logprobs): one check, no call per item
            if not all(_is(item, v) for v in value):
                bad = next(i for i, v in enumerate(value) if not _is(item, v))
                raise PendingRolloutError(f"{at}[{bad}]: expected {item.__name__}, got {value[bad]!r}")
            return origin(value)
        return origin(_decode(item, v, f"{at}[{i}]") for i, v in enumerate(value))
    if hint in (int, float, str, bool):
        if not _is(hint, value):
            raise PendingRolloutError(f"{at}: expected {hint.__name__}, got {value!r}")
        return value
    raise PendingRolloutError(f"{at}: no reader for the field type {hint!r}")  # a new field type: add it above


_type_hints = functools.cache(typing.get_type_hints)  # resolving string annotations is slow; once per record type


def _is(kind: type, value: Any) -> bool:
    """JSON's exact type; a float field may hold an int (written from an int, it reads back as that int)."""
    return type(value) is kind or (kind is float and type(value) is int)


def _decode_train_state(value: Any, at: str) -> checkpoint.TrainState:
    """A TrainState with its RNG state in the types `checkpoint.capture_rng` returns (tuples, a uint32 array)."""
    plain = {"step": int, "cursor_epoch": int, "cursor_position": int, "rng": dict}
    if not isinstance(value, dict) or set(value) != set(plain):
        raise PendingRolloutError(f"{at}: expected a TrainState with fields {list(plain)}")
    for name, kind in plain.items():
        if type(value[name]) is not kind:
            raise PendingRolloutError(f"{at}.{name}: expected {kind.__name__}, got {value[name]!r}")
    rng: dict[str, Any] = {}
    try:
        for key, state in value["rng"].items():
            if key == "python":  # random.getstate(): (version, 625 ints, gauss_next)
                version, internal, gauss = state
                rng[key] = (_decode(int, version, f"{at}.rng.python"), _decode(tuple[int, ...], internal,
                            f"{at}.rng.python"), _decode(float | None, gauss, f"{at}.rng.python"))
            elif key == "numpy":  # np.random.get_state(): (name, 624 uint32, pos, has_gauss, cached_gaussian)
                name, keys, pos, has_gauss, cached = state
                rng[key] = (_decode(str, name, f"{at}.rng.numpy"), np.array(keys, dtype=np.uint32),
                            _decode(int, pos, f"{at}.rng.numpy"), _decode(int, has_gauss, f"{at}.rng.numpy"),
                            _decode(float, cached, f"{at}.rng.numpy"))
            elif key == "torch":  # torch.get_rng_state().tolist()
                rng[key] = _decode(list[int], state, f"{at}.rng.torch")
            else:
                raise PendingRolloutError(f"{at}.rng: unknown generator {key!r}")
    except PendingRolloutError:
        raise
    except (TypeError, ValueError, OverflowError) as e:  # a wrong shape (unpacking), a key out of uint32 range
        raise PendingRolloutError(f"{at}.rng: not an RNG state ({e})") from None
    return checkpoint.TrainState(value["step"], value["cursor_epoch"], value["cursor_position"], rng)


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f
