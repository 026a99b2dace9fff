"""Start or attach to Ray once per command.

- `ray.local_mode=true`: no Ray at all; groups build their workers in this process.
- `ray.address` empty and no RAY_ADDRESS in the environment: start a private local cluster on loopback.
- otherwise attach (`ray job submit` sets RAY_ADDRESS; `ray.address=auto` finds a running head).

`wait_placeable` bounds the wait for room on the cluster (a node with the CPUs, GPUs and custom resources an actor
asks for): Ray itself would keep an actor that fits no live node pending forever, e.g. once the only node offering
`rollout.resources` is gone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
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
    # binding the external interface on this kind of machine). address="local": never the cluster a `ray start
    # --head` on this machine left in /tmp/ray/ray_current_cluster, which a bare ray.init() would attach to.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(address="local", num_cpus=cfg.num_cpus or max(os.cpu_count() or 1, MIN_LOCAL_CPUS),
             num_gpus=cfg.num_gpus if cfg.num_gpus >= 0 else None, include_dashboard=False,
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


class PlacementTimeout(RuntimeError):
    """The cluster had no room for an actor's resources within its placement timeout."""


def wait_placeable(bundles: Sequence[Mapping[str, float]], timeout_s: float, what: str, timeout_key: str) -> None:
    """Return once the cluster has room for all `bundles` ({"CPU": 1, "rollout_node": 0.01}, ...) at once: a placement
    group of them is placed, then freed, and actors asking for them find their place. PlacementTimeout after
    `timeout_s` (config key `timeout_key`), naming `what`, the request and the cluster's nodes."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    wanted = [b for b in ({k: float(v) for k, v in bundle.items() if v} for bundle in bundles) if b]
    if not wanted:
        return  # nothing reserved: an actor that asks for nothing fits any node
    group = placement_group(wanted, strategy="PACK")
    try:
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    finally:
        remove_placement_group(group)
    if not ready:
        asked = wanted[0] if len(wanted) == 1 else f"{len(wanted)} x {wanted[0]}"
        raise PlacementTimeout(f"no room for {asked} ({what}) on the cluster within {timeout_key}={timeout_s:g}s; "
                               f"{describe_nodes(wanted[0])}")


def describe_nodes(request: Mapping[str, float], most: int = 4) -> str:
    """The live nodes with what they offer of `request`'s resources, and the nodes that are gone (the last `most`
    of each), e.g. "live nodes: 1a2b3c4d (10.0.0.1): CPU=8; gone: 5e6f7a8b (10.0.0.2)" (Ray no longer reports
    what a gone node offered)."""
    import ray

    keys = ["CPU", "GPU", *sorted(k for k in request if k not in ("CPU", "GPU"))]

    def node(n: Mapping) -> str:
        offer = ", ".join(f"{k}={n['Resources'][k]:g}" for k in keys if k in (n.get("Resources") or {}))
        where = f"{n['NodeID'][:8]} ({n['NodeManagerAddress']})"
        if not n["Alive"]:
            return where + (f": {offer}" if offer else "")
        return f"{where}: {offer or 'none of these resources'}"

    def listing(items: list[str]) -> str:
        return "; ".join(items[-most:]) + (f" (+{len(items) - most} more)" if len(items) > most else "")

    nodes = ray.nodes()
    live, gone = [node(n) for n in nodes if n["Alive"]], [node(n) for n in nodes if not n["Alive"]]
    return f"live nodes: {listing(live) or 'none'}" + (f"; gone: {listing(gone)}" if gone else "")
