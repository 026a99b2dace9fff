"""`--dry-run`'s placement: the plan's actor groups reserved on the Ray cluster at once, then released.

First the arithmetic: each group in the order the run starts them (engines, learner, reward pool) takes its share of
the cluster's resources, so the first group that does not fit is named with the resource it lacks and by how much.
A private local cluster can grow no node, so that is the answer there. On a cluster that can (an autoscaler), the
groups are then reserved as placement groups and given `timeout_s` to be placed, as the run's own would be.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shop_r1.plan import ActorGroup


def shortfalls(groups: Sequence[ActorGroup], cluster: Mapping[str, float]) -> list[str]:
    """The groups that do not fit what `cluster` offers once the groups before them took theirs, one line each:
    'learner: 4 x {CPU=8, GPU=1} do not fit: the cluster has GPU=4 in all, 0 left after rollout; 4 GPU short
    (change learner.* or add nodes)'."""
    left = {k: float(v) for k, v in cluster.items()}
    taken: list[str] = []
    problems = []
    for g in groups:
        need = {k: g.count * v for k, v in g.bundle.items() if v}
        short = {k: v - left.get(k, 0.0) for k, v in need.items() if v > left.get(k, 0.0) + 1e-9}
        if short:
            bundle = ", ".join(f"{k}={v:g}" for k, v in g.bundle.items() if v)
            have = "; ".join(f"{k}={cluster.get(k, 0.0):g} in all, {max(left.get(k, 0.0), 0.0):g} left"
                             + (f" after {', '.join(taken)}" if taken else "") for k in short)
            lack = ", ".join(f"{v:g} {k}" for k, v in short.items())
            problems.append(f"{g.name}: {g.count} x {{{bundle}}} do not fit: the cluster has {have}; {lack} short "
                            f"(change {g.name}.* or add nodes)")
        for k, v in need.items():
            left[k] = left.get(k, 0.0) - v
        taken.append(g.name)
    return problems


def try_placement(groups: Sequence[ActorGroup], timeout_s: float, can_grow: bool) -> list[str]:
    """Reserve every group at once (one placement group each, PACK as the learner's own) and release them; the
    problems, one line each (none: the run can start)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    problems = shortfalls(groups, ray.cluster_resources())
    if problems and not can_grow:
        return problems
    reserved = []
    try:
        for g in groups:
            bundle = {k: float(v) for k, v in g.bundle.items() if v}
            if bundle and g.count:
                reserved.append((g, placement_group([dict(bundle) for _ in range(g.count)], strategy="PACK")))
        refs = [pg.ready() for _, pg in reserved]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        late = [g.name for (g, _), ref in zip(reserved, refs) if ref not in ready]
    finally:
        for _, pg in reserved:
            remove_placement_group(pg)
    if late:
        return problems or [f"{', '.join(late)}: not placed within {timeout_s:g}s (the cluster's resources: "
                            f"{ray.cluster_resources()}); add nodes or lower the groups' resources (an autoscaler "
                            "may still be adding nodes: run the dry run again)"]
    return []
