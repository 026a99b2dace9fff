"""ray and reward_pool: the cluster a run starts or attaches to and the reward actors on it; the formats that place
actors (`parse_resources`, `parse_cpu_cores`) and their rules (`problems`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from shop_r1.config.fields import ConfigError, bounded
from shop_r1.config.learner import LearnerConfig
from shop_r1.config.rollout import RolloutConfig


@dataclass
class RewardPoolConfig:
    num_workers: int = bounded(2, ge=1)
    """Reward actors, separate from the engines."""
    timeout_s: float = bounded(30.0, gt=0)
    """Scoring time of one chunk, counted only once its worker is ready (see ready_timeout_s). A chunk not scored in
    this time, or whose worker dies, is re-scored one response at a time on a ready worker, each with this full
    budget; a response that hangs or crashes again gets the documented fallback (reward 0, counted in
    `reward/num_failed`)."""
    ready_timeout_s: float = bounded(300.0, gt=0)
    """How long a freshly started reward worker may take to become ready (start and imports; seconds under load).
    A worker not ready in this time is an error that stops the run, not a fallback."""
    max_failed_fraction: float = bounded(0.05, ge=0, le=1)
    """A step whose share of fallback rewards (timeouts, crashes, scorer errors) exceeds this stops the run with an
    error naming the cause; 1.0 turns the check off."""
    num_cpus_per_worker: float = bounded(0.5, ge=0)
    """Ray CPUs reserved per reward actor (0: they share the CPUs the engines and ranks leave)."""
    resources: str = ""
    """Ray custom resources each reward actor takes, so the pool lands only on nodes that offer them (as
    rollout.resources). Format: name=amount pairs joined by commas; each amount > 0, whole above 1."""


@dataclass
class RayConfig:
    address: str = ""
    """Empty: start a local Ray cluster for this command. 'auto' or ray://...: attach (e.g. under `ray job submit`)."""
    num_cpus: int = bounded(0, ge=0)
    """Logical CPUs of a local cluster (0: this machine's cores, at least 6 so a GRPO run's workers all fit)."""
    num_gpus: int = bounded(-1, ge=-1)
    """Logical GPUs of a local cluster (-1: the GPUs Ray detects). Set it to plan a GPU run on a machine without
    them (`--dry-run` with ray.num_gpus=8 checks an 8-GPU placement), never to train."""
    local_mode: bool = False
    """Run every worker in this process, no Ray at all (unit tests, debugging); same typed methods."""


PLACEMENT_KEYS = ("rollout.resources", "learner.resources", "reward_pool.resources")
"""The fields that place actors by Ray custom resources (`parse_resources`)."""
RAY_RESOURCE_UNIT = 1e-4
"""Ray counts resource amounts in units of 1e-4: a smaller amount is 0 to it."""


def parse_resources(text: str, key: str) -> dict[str, float]:
    """`"name=amount,name=amount"` (spaces around the parts allowed; empty: none) as {name: amount}, the Ray custom
    resources one actor takes. A `ConfigError` naming `key` when malformed: each amount a number > 0 that Ray takes
    (at least 1e-4, whole above 1), each name once, no spaces in it, and not CPU / GPU / memory (their own fields)."""
    fmt = "format: name=amount pairs joined by commas, e.g. 'rollout_node=0.01,zone_a=1'"
    if not isinstance(text, str):
        raise ConfigError(f"{key}={text!r}: expected a string ({fmt})")
    out: dict[str, float] = {}
    if not text.strip():
        return out
    for item in text.split(","):
        name, sep, amount_text = (part.strip() for part in item.partition("="))
        if not sep or not name or any(c.isspace() for c in name):
            raise ConfigError(f"{key}={text!r}: {item.strip()!r} is not name=amount ({fmt})")
        if name in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ConfigError(f"{key}={text!r}: {name} is not a custom resource (CPUs and GPUs have their own "
                              "num_cpus_* / num_gpus_* fields)")
        if name in out:
            raise ConfigError(f"{key}={text!r}: {name!r} is given twice")
        try:
            amount = float(amount_text)
        except ValueError:
            amount = math.nan
        if not (math.isfinite(amount) and amount >= RAY_RESOURCE_UNIT) or (amount > 1 and not amount.is_integer()):
            raise ConfigError(f"{key}={text!r}: the amount of {name!r} must be a number Ray takes, at least "
                              f"{RAY_RESOURCE_UNIT:g} and whole above 1; got {amount_text!r}")
        out[name] = amount
    return out


CPU_LIST_KEYS = ("rollout.cpu_cores", "learner.cpu_cores")
"""The fields that take a CPU list (`parse_cpu_cores`); a bare number in YAML is read as a one-core list."""


def parse_cpu_cores(text: str, key: str) -> tuple[int, ...]:
    """A Linux CPU list ("0", "0-3", "0,2,5-6") as sorted distinct core ids; "" -> (). A malformed one is a
    ConfigError naming `key`."""
    cores: set[int] = set()
    for part in (p.strip() for p in text.split(",")) if text.strip() else ():
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and (not hi.isdigit() or int(hi) < int(lo))):
            raise ConfigError(f"{key}={text!r}: expected a CPU list such as \"0\", \"0-3\" or \"0,2\" "
                              f"(bad part {part!r})")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(cores))


class _Sections(Protocol):
    """What the placement rules read of the root Config (which imports this module)."""

    rollout: RolloutConfig
    learner: LearnerConfig
    reward_pool: RewardPoolConfig


def problems(cfg: _Sections, bad: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The placement fields' rules, one line each: each CPU list well-formed and the two disjoint, each custom
    resource list well-formed (`PLACEMENT_KEYS`)."""
    out, pinned = [], {}
    rollout, learner = cfg.rollout.cpu_cores, cfg.learner.cpu_cores
    for key, text in (("rollout.cpu_cores", rollout), ("learner.cpu_cores", learner)):
        try:
            pinned[key] = set(parse_cpu_cores(text, key))
        except ConfigError as exc:
            out.append(str(exc))
    if len(pinned) == 2 and pinned["rollout.cpu_cores"] & pinned["learner.cpu_cores"]:
        out.append(f"rollout.cpu_cores={rollout!r} and learner.cpu_cores={learner!r} share cores: pinning is for "
                   "keeping the engines' and the ranks' threads apart; give them disjoint lists (or leave one empty)")
    for key in PLACEMENT_KEYS:
        section, name = key.split(".")
        try:
            parse_resources(getattr(getattr(cfg, section), name), key)
        except ConfigError as exc:
            out.append(str(exc))
    return out
