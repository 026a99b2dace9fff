"""Start or attach to Ray once per command.

- `ray.local_mode=true`: no Ray at all; groups build their workers in this process.
- `ray.address` empty and no RAY_ADDRESS in the environment: start a private local cluster on loopback.
- otherwise attach (`ray job submit` sets RAY_ADDRESS; `ray.address=auto` finds a running head).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from shop_r1.config import RayConfig
from shop_r1.distributed.actors import actor_env

# A local cluster advertises at least this many logical CPUs, so that the engine, the learner and the reward pool of a
# GRPO run can all be placed on a 2-core machine (they time-share its cores; nothing is pinned by Ray on CPU).
MIN_LOCAL_CPUS = 6


@dataclass(frozen=True)
class RayRuntime:
    local_mode: bool
    started_here: bool
    """True when this command started the cluster and so must shut it down."""
    address: str

    def shutdown(self) -> None:
        if self.started_here:
            import ray

            ray.shutdown()


def _not_set_by_job(env_vars: dict[str, str]) -> dict[str, str]:
    """`env_vars` minus the keys the submitted job's runtime env already sets (none outside a job)."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "")
    if not raw:
        return env_vars
    job_env = ((json.loads(raw).get("runtime_env") or {}).get("env_vars") or {})
    return {k: v for k, v in env_vars.items() if k not in job_env}


def _ray_logging_level() -> int:
    """Ray's driver-side start-up lines ("Started a local Ray instance", the notice that token authentication is on
    by default, as it should be) only with --verbose / SHOP_R1_VERBOSE=1."""
    import logging

    if os.environ.get("SHOP_R1_VERBOSE") == "1":
        return logging.INFO
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    return logging.WARNING


def start_ray(cfg: RayConfig) -> RayRuntime:
    if cfg.local_mode:
        return RayRuntime(local_mode=True, started_here=False, address="local")
    import ray

    if ray.is_initialized():
        return RayRuntime(local_mode=False, started_here=False, address="existing")
    # RAY_ADDRESS (set by `ray job submit` for the job's driver) names this job's cluster: it wins over `auto`,
    # which would otherwise look for whichever head was started last on this machine.
    env_address = os.environ.get("RAY_ADDRESS", "")
    address = env_address if cfg.address in ("", "auto") and env_address else cfg.address
    if address:
        # Under `ray job submit` the job's runtime env (working_dir, env_vars) is merged with ours, and Ray refuses a
        # key set by both: the job's own values win, ours only fill in what it leaves unset.
        ray.init(address=address, runtime_env={"env_vars": _not_set_by_job(actor_env())}, log_to_driver=True,
                 logging_level=_ray_logging_level())
        return RayRuntime(local_mode=False, started_here=True, address=address)
    # A private cluster for this command, on loopback only (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray from
    # binding the external interface on this kind of machine).
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=cfg.num_cpus or max(os.cpu_count() or 1, MIN_LOCAL_CPUS), include_dashboard=False,
             _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": actor_env()}, log_to_driver=True, logging_level=_ray_logging_level())
    return RayRuntime(local_mode=False, started_here=True, address="local-cluster")


@contextmanager
def ray_runtime(cfg: RayConfig) -> Iterator[RayRuntime]:
    """Start or attach for the duration of a command; a cluster started here is shut down on the way out."""
    runtime = start_ray(cfg)
    try:
        yield runtime
    finally:
        runtime.shutdown()
