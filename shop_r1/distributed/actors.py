"""Actors with one calling convention for Ray and for local (in-process) mode.

    handle = spawn(VLLMEngine, model_path, cfg, local=False, resources=Resources(num_cpus=1))
    ref = handle.generate.remote(prompts, spec)      # same line in local mode
    generations = get(ref, timeout_s=600)

In local mode `.remote()` runs the method at once and returns a `LocalRef` holding its value or its exception,
which `get` returns or raises, so errors surface at the same place as with Ray.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

if TYPE_CHECKING:
    from ray import ObjectRef

T = TypeVar("T")

# Forwarded to every actor so a worker on another node behaves like the driver (offline hub, CPU accelerator, ...).
FORWARDED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "DS_ACCELERATOR",
                 "WANDB_MODE", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "TORCH_EXTENSIONS_DIR",
                 "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "SHOP_R1_CACHE", "PYTHONPATH", "VLLM_LOGGING_LEVEL")


class ActorTimeout(TimeoutError):
    """An actor call did not finish within its timeout (shop_r1/distributed/deadlines.py): the actor is hung, and
    `is_actor_death` counts it as dead."""


@dataclass(frozen=True)
class Resources:
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for this actor (e.g. RANK / MASTER_ADDR for a learner rank)."""
    placement_group: Any = None
    bundle_index: int = -1
    cpu_cores: tuple[int, ...] = ()
    """Pin the actor's process to these cores (rollout.cpu_cores, learner.cpu_cores), with as many OpenMP threads,
    waiting passively; () no pinning. Ray actors only: local mode runs everything in the driver's process."""
    custom: dict[str, float] = field(default_factory=dict)
    """Ray custom resources this actor takes (e.g. {"rollout_node": 0.01}): it is placed only on nodes that offer
    them (config: rollout.resources, learner.resources, reward_pool.resources)."""


class LocalRef:
    """A finished call in local mode: its value, or the exception it raised."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


Ref: TypeAlias = "LocalRef | ObjectRef"
"""A call in flight: what `handle.method.remote(...)` returns, for `get`, `wait_all` and `wait_first`."""


class _LocalMethod:
    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> LocalRef:
        try:
            return LocalRef(value=self._fn(*args, **kwargs))
        except Exception as e:  # surfaced by get(), as Ray would
            return LocalRef(error=e)


class LocalActor:
    """Wraps an object so `actor.method.remote(...)` works as on a Ray actor handle."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> _LocalMethod:
        return _LocalMethod(getattr(self._obj, name))


def actor_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    env.update(extra or {})
    return env


_ACTOR_LOG_DIR: str | None = None


def set_actor_log_dir(path: str | os.PathLike | None) -> None:
    """Actors spawned from now on write their stdout and stderr (library warnings and progress bars included) to
    PATH/<Class>-<pid>.log instead of streaming them to this console; None: stream them (`--verbose`)."""
    global _ACTOR_LOG_DIR
    _ACTOR_LOG_DIR = None if path is None else os.path.abspath(path)


def _redirect_output(path: str) -> None:
    """Point this process's file descriptors 1 and 2 at `path` (appending): C and C++ output follows too."""
    import sys

    os.makedirs(os.path.dirname(path), exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _with_log_file(cls: type, log_dir: str) -> type:
    """`cls`, whose instances first send their process's output to LOG_DIR/<Class>-<pid>.log."""

    class Logged(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _redirect_output(os.path.join(log_dir, f"{cls.__name__}-{os.getpid()}.log"))
            super().__init__(*args, **kwargs)

    Logged.__name__, Logged.__qualname__ = cls.__name__, cls.__qualname__
    return Logged


def pinning_env(cores: tuple[int, ...]) -> dict[str, str]:
    """The environment a process pinned to `cores` starts with: that many OpenMP threads, passive waits (a thread
    idle between parallel regions sleeps instead of spinning on a core the other stage needs)."""
    return {"OMP_NUM_THREADS": str(len(cores)), "OMP_WAIT_POLICY": "PASSIVE"} if cores else {}


def thread_count(resources: Resources) -> int:
    """The OpenMP / torch threads of an actor: one per core it is pinned to, else the whole CPUs it reserved (at least
    one: a reward worker reserves 0 by default). What Ray itself sets only when OMP_NUM_THREADS is unset in a fresh
    worker; explicit here, because a reused worker process, or a user's OMP_NUM_THREADS, would otherwise decide."""
    return len(resources.cpu_cores) if resources.cpu_cores else max(1, math.floor(resources.num_cpus))


def _with_threads(cls: type, threads: int) -> type:
    """`cls`, whose instances first set torch's thread count to `threads` when torch is already imported in the
    process (a reused worker); a fresh process reads OMP_NUM_THREADS when it imports torch."""

    class Threaded(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            torch = sys.modules.get("torch")
            if torch is not None and torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            super().__init__(*args, **kwargs)

    Threaded.__name__, Threaded.__qualname__ = cls.__name__, cls.__qualname__
    return Threaded


def _pinned(cls: type, cores: tuple[int, ...]) -> type:
    """`cls`, whose instances first pin their process to `cores` (before any thread pool starts)."""

    class Pinned(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            try:
                os.sched_setaffinity(0, cores)
            except OSError as exc:
                raise RuntimeError(f"{cls.__name__}: cannot pin to CPU cores {list(cores)} on this node "
                                   f"(it has {sorted(os.sched_getaffinity(0))}): {exc}; check rollout.cpu_cores / "
                                   "learner.cpu_cores") from exc
            super().__init__(*args, **kwargs)

    Pinned.__name__, Pinned.__qualname__ = cls.__name__, cls.__qualname__
    return Pinned


def spawn(cls: type, *args: Any, local: bool, resources: Resources = Resources(), **kwargs: Any) -> Any:
    """Create `cls(*args, **kwargs)` as a Ray actor (or in-process when `local`); its output goes to the actor log
    folder when one is set (`set_actor_log_dir`)."""
    if local:
        return LocalActor(cls(*args, **kwargs))
    import ray

    if _ACTOR_LOG_DIR is not None:
        cls = _with_log_file(cls, _ACTOR_LOG_DIR)
    threads = thread_count(resources)
    cls = _with_threads(cls, threads)
    if resources.cpu_cores:
        cls = _pinned(cls, resources.cpu_cores)

    options: dict[str, Any] = {"num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus,
                               "runtime_env": {"env_vars": actor_env({"OMP_NUM_THREADS": str(threads),
                                                                      **pinning_env(resources.cpu_cores),
                                                                      **resources.env})}}
    if resources.custom:
        options["resources"] = dict(resources.custom)
    if resources.placement_group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=resources.placement_group, placement_group_bundle_index=resources.bundle_index,
            placement_group_capture_child_tasks=True)
    return ray.remote(cls).options(**options).remote(*args, **kwargs)


def _unwrap(ref: Any) -> Any:
    if ref.error is not None:
        raise ref.error
    return ref.value


def get(refs: Any, timeout_s: float | None = None, what: str = "") -> Any:
    """Resolve one ref or a list of refs (Ray or local); raises the remote error, or ActorTimeout.

    The driver always passes `timeout_s` (shop_r1/distributed/deadlines.py) and `what`: the call and the config key
    of its timeout, for the ActorTimeout's message."""
    single = not isinstance(refs, (list, tuple))
    items = [refs] if single else list(refs)
    if all(isinstance(r, LocalRef) for r in items):
        values = [_unwrap(r) for r in items]
    else:
        import ray

        try:
            values = ray.get(items, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise ActorTimeout(f"{what or 'actor call'}: not done within {timeout_s:g} s") from e
    return values[0] if single else values


def wait_first(refs: Sequence[Any], timeout_s: float | None = None) -> tuple[list[Any], list[Any]]:
    """Split refs into (finished, pending), returning as soon as at least one is finished (or the timeout)."""
    if all(isinstance(r, LocalRef) for r in refs):
        return list(refs), []
    import ray

    ready, pending = ray.wait(list(refs), num_returns=1, timeout=timeout_s)
    return ready, pending


def wait_all(refs: Sequence[Any], timeout_s: float) -> list[Any]:
    """The refs whose calls finished (returned or raised) within `timeout_s`: all of them unless the time ran out.
    Raises nothing; `get` on a finished ref returns its value or raises its error at once."""
    if all(isinstance(r, LocalRef) for r in refs):
        return list(refs)
    import ray

    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    return ready


def is_actor_death(error: BaseException) -> bool:
    """The actor's process is gone (killed, crashed, its node lost), or a call to it passed its deadline
    (ActorTimeout: it no longer answers, and the driver that handles this kills it), as opposed to an error its
    method raised. The GRPO and SFT drivers restart from the last checkpoint on either."""
    if isinstance(error, ActorTimeout):
        return True
    try:
        import ray
    except ImportError:
        return False
    return isinstance(error, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError))


def with_restarts(attempt: Callable[[bool], T], max_restarts: int, local: bool, tag: str) -> T:
    """`attempt(resume)` until it returns: an actor that died or hung (`is_actor_death`) ends the attempt, and the next
    one resumes from the last checkpoint, at most `max_restarts` times; any other error (or one in local mode, where
    nothing can be restarted) is raised. The first attempt gets resume=False (the caller decides for itself)."""
    for restart in range(max_restarts + 1):
        try:
            return attempt(restart > 0)
        except Exception as e:
            if local or not is_actor_death(e) or restart == max_restarts:
                raise
            print(f"[{tag}] an actor died or hung ({type(e).__name__}: {str(e).splitlines()[0][:200]}); actors torn "
                  f"down, resuming from the last checkpoint (restart {restart + 1} of at most {max_restarts})",
                  flush=True)
    raise AssertionError("unreachable")


def kill(handle: Any) -> None:
    if isinstance(handle, LocalActor):
        return
    import ray

    ray.kill(handle, no_restart=True)
