"""A group of rollout engines, one per Ray actor, that splits a batch of prompts and gathers results in order.

`generate_scored` streams: each engine's share goes out as one generate call (the largest decode batch; scoring is
under 0.2% of a step, so cutting shares into chunks to overlap it cost more than it hid), and every share goes to the
reward pool the moment its engine returns it, so one engine's scoring overlaps the others' generation.

Faults: an engine whose process dies during a call (killed, OOM, segfault, node lost), or that answers none of its
chunks within `rollout.generate_timeout_s`, is replaced by a fresh engine on the same resources; `on_replace` (set by
the weight sync) brings every engine to the learner's current weights and version before it serves again, and the
lost chunks are resubmitted. Sampling is seeded per request, so the requeued prompts draw the samples they would
have drawn. An engine still receiving weights at the sync's deadline (`rollout.weight_sync_timeout_s`) is replaced
the same way (shop_r1/distributed/sync_group.py). At most `rollout.max_engine_restarts` replacements per run, then
EngineFailure.

Placement: each engine takes `rollout.num_cpus_per_engine` CPUs, `num_gpus_per_engine` GPUs and the custom resources
of `rollout.resources`. The engines at start and every replacement wait at most `rollout.placement_timeout_s` for a
node with room for them: when the only nodes offering `rollout.resources` are gone, the replacement is an
EngineFailure naming the resources and the nodes (the driver checkpoints, and the run resumes once a node is back).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from shop_r1.config import RolloutConfig, parse_cpu_cores, parse_resources
from shop_r1.distributed import deadlines
from shop_r1.distributed.actors import Resources, get, is_actor_death, kill, spawn, wait_first
from shop_r1.distributed.reward_pool import RewardPool
from shop_r1.distributed.runtime import PlacementTimeout, wait_placeable
from shop_r1.reward.failures import RewardFailures, count_failures
from shop_r1.types import Generation, Prompt, SamplingSpec, ScoredGeneration, ScoreRequest


class EngineFailure(RuntimeError):
    """Rollout engines failed more often than rollout.max_engine_restarts allows, or a dead engine's replacement found
    no room on the cluster within rollout.placement_timeout_s."""


@dataclass(frozen=True)
class ScoredBatch:
    scored: list[ScoredGeneration]
    generate_s: float
    """Until the last engine returned (scoring of earlier chunks overlaps this)."""
    reward_wait_s: float
    """Scoring time not hidden behind generation."""

    @cached_property
    def failures(self) -> RewardFailures:
        """The batch's fallback rewards, counted on first use and kept: the driver's failure check and its metrics
        read the same record. Derived, not a field (a pending rollout's JSON does not carry it)."""
        return count_failures([r for s in self.scored for r in s.rewards])


def split_evenly(n: int, parts: int) -> list[range]:
    """Contiguous ranges covering 0..n-1, sizes differing by at most one (empty ranges dropped)."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        if size:
            out.append(range(start, start + size))
        start += size
    return out


class EngineGroup:
    def __init__(self, model_path: str, cfg: RolloutConfig, max_model_len: int, seed: int, local: bool,
                 engine_cls: type | None = None) -> None:
        if engine_cls is None:
            from shop_r1.rollout.vllm_engine import VLLMEngine as engine_cls  # noqa: N813 - the default backend
        if local and cfg.num_engines != 1:
            raise ValueError(f"rollout.num_engines={cfg.num_engines}: local mode runs exactly one engine in-process "
                             "(vLLM pins this process's threads); use Ray for more")
        cores = parse_cpu_cores(cfg.cpu_cores, "rollout.cpu_cores")
        resources = Resources(num_cpus=cfg.num_cpus_per_engine, num_gpus=cfg.num_gpus_per_engine,
                              custom=parse_resources(cfg.resources, "rollout.resources"), cpu_cores=cores,
                              # vLLM's CPU worker binds its OpenMP threads itself: to the same cores
                              env={"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores))} if cores else {})
        self._bundle = {"CPU": resources.num_cpus, "GPU": resources.num_gpus, **resources.custom}
        """One engine's resources: what must fit a live node before an engine is spawned."""
        if not local:
            wait_placeable([self._bundle] * cfg.num_engines, cfg.placement_timeout_s,
                           f"{cfg.num_engines} rollout engine(s)", "rollout.placement_timeout_s")
        # Each engine gets its own sampling seed so the group does not draw the same samples on every engine.
        self._make = lambda i: spawn(engine_cls, model_path, cfg, max_model_len, seed + 1000 * i, local=local,
                                     resources=resources)
        self.engines = [self._make(i) for i in range(cfg.num_engines)]
        self.chunks_per_engine = 1
        """Generate calls per engine per batch (more would overlap scoring with generation at the cost of smaller
        decode batches)."""
        self.local, self.cfg, self.model_path, self.max_model_len = local, cfg, model_path, max_model_len
        self.start_timeout_s = deadlines.start_timeout_s(deadlines.model_bytes(model_path))
        """An engine's start (vLLM loading the model): the bound of a call that may be a fresh engine's first."""
        self.restarts = 0
        self.on_replace: Callable[[], None] | None = None
        """Called after every replacement: brings all engines to the learner's weights and version."""
        self.defer_resync = False
        """Set while a rollout runs beside a learner update (one-step-off async): a replacement then only marks
        `resync_pending`, and the driver resyncs once the learner is idle (no learner call from two threads)."""
        self.resync_pending = False

    def replace(self, index: int, reason: str) -> None:
        """Engine `index` is dead or hung: a fresh one takes its place (and its resources), then `on_replace`."""
        if self.local:
            raise EngineFailure(f"rollout engine {index} {reason} (local mode runs the engine in this process: "
                                "nothing to replace)")
        if self.restarts >= self.cfg.max_engine_restarts:
            raise EngineFailure(f"rollout engine {index} {reason}, after {self.restarts} engine restart(s) this run "
                                f"(rollout.max_engine_restarts={self.cfg.max_engine_restarts})")
        self.restarts += 1
        try:
            kill(self.engines[index])
        except Exception:  # noqa: BLE001 - already gone is what we expect
            pass
        try:  # Ray would keep a replacement that fits no live node pending forever: bound the wait
            wait_placeable([self._bundle], self.cfg.placement_timeout_s, "its replacement",
                           "rollout.placement_timeout_s")
        except PlacementTimeout as e:
            raise EngineFailure(f"rollout engine {index} {reason}; {e}. Bring back a node that offers the engines' "
                                "resources (or change rollout.resources), then resume the run (--resume)") from None
        self.engines[index] = self._make(index)
        print(f"[engines] engine {index} {reason}: replaced by a fresh engine (restart {self.restarts} of at most "
              f"{self.cfg.max_engine_restarts}); its prompts are requeued", flush=True)
        if self.defer_resync:
            self.resync_pending = True
        elif self.on_replace is not None:
            self.on_replace()

    def _chunks(self, num_prompts: int) -> list[tuple[int, range]]:
        """(engine index, prompt range) pairs: each engine's contiguous share, cut into `chunks_per_engine` pieces."""
        out = []
        for index, share in enumerate(split_evenly(num_prompts, len(self.engines))):
            for piece in split_evenly(len(share), self.chunks_per_engine):
                out.append((index, range(share.start + piece.start, share.start + piece.stop)))
        return out

    def _run(self, prompt_token_ids: Sequence[Sequence[int]], spec: SamplingSpec,
             on_chunk: Callable[[list[Generation]], None]) -> None:
        """Every chunk generated once, `on_chunk` called with each as it returns (renumbered to batch positions).

        A chunk whose engine died is resubmitted to its replacement; when no chunk returns within the timeout,
        every engine holding one is replaced and its chunks resubmitted.
        """
        pending: dict[Any, tuple[int, Any, range]] = {}

        def submit(index: int, rng: range) -> None:
            handle = self.engines[index]
            pending[handle.generate.remote([list(prompt_token_ids[i]) for i in rng], spec)] = (index, handle, rng)

        for index, rng in self._chunks(len(prompt_token_ids)):
            submit(index, rng)
        while pending:
            ready, _ = wait_first(list(pending), timeout_s=self.cfg.generate_timeout_s)
            if not ready:
                stuck = list(pending.values())
                pending.clear()
                for index in sorted({index for index, _, _ in stuck}):
                    self.replace(index, f"returned nothing within rollout.generate_timeout_s="
                                        f"{self.cfg.generate_timeout_s:g}")
                for index, _, rng in stuck:
                    submit(index, rng)
                continue
            for ref in ready:
                index, handle, rng = pending.pop(ref)
                try:
                    gens = get(ref, timeout_s=self.cfg.generate_timeout_s, what="a finished generate's result")
                except Exception as e:  # noqa: BLE001 - only an engine's death is recovered, the rest re-raised
                    if not is_actor_death(e):
                        raise
                    if self.engines[index] is handle:  # the first of its lost chunks to report: replace it once
                        self.replace(index, f"died during generate ({type(e).__name__})")
                    submit(index, rng)
                    continue
                on_chunk(_renumber(gens, rng))

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Generation]:
        """All prompts' generations in the prompts' order (prompt_index renumbered to the batch position)."""
        out: list[Generation] = []
        self._run(prompt_token_ids, spec, out.extend)
        return sorted(out, key=lambda g: g.prompt_index)

    def generate_scored(self, prompts: Sequence[Prompt], spec: SamplingSpec, pool: RewardPool) -> ScoredBatch:
        """Generate, and score each chunk as soon as its engine returns it. Results in the prompts' order."""
        start = time.perf_counter()
        tickets = []

        def score(gens: list[Generation]) -> None:
            requests = [ScoreRequest(c.text, prompts[g.prompt_index].target, c.token_logprobs(g.vocab_size),
                                     prompts[g.prompt_index].page_names, prompts[g.prompt_index])
                        for g in gens for c in g.completions]
            tickets.append((gens, pool.submit(requests)))

        self._run([p.token_ids for p in prompts], spec, score)
        generated = time.perf_counter()
        scored: list[ScoredGeneration] = []
        for gens, ticket in tickets:
            rewards = iter(pool.collect(ticket))
            for g in gens:
                scored.append(ScoredGeneration(prompts[g.prompt_index], g,
                                               tuple(next(rewards) for _ in g.completions)))
        scored.sort(key=lambda s: s.generation.prompt_index)
        return ScoredBatch(scored, generate_s=generated - start, reward_wait_s=time.perf_counter() - generated)

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Load the same tensors into every engine (through the object store; the GRPO loop uses weight_sync)."""
        tensors, override = list(named_tensors), self.cfg.weight_sync_timeout_s
        num_bytes = sum(t.numel() * t.element_size() for _, t in tensors)
        get([e.load_weights.remote(tensors, version) for e in self.engines],
            timeout_s=deadlines.weight_sync_timeouts(num_bytes, override).push_s,
            what=f"loading weights into the engines ({deadlines.explain('rollout.weight_sync_timeout_s', override)})")

    def set_policy_version(self, version: int) -> None:
        """Stamp every engine with `version` without new weights (after an update that changed nothing)."""
        override = self.cfg.weight_sync_timeout_s
        get([e.set_policy_version.remote(version) for e in self.engines],
            timeout_s=deadlines.weight_sync_timeouts(0, override).push_s,
            what=f"stamping the engines with version {version} "
                 f"({deadlines.explain('rollout.weight_sync_timeout_s', override)})")

    def policy_versions(self) -> list[int]:
        return get([e.policy_version.remote() for e in self.engines], timeout_s=self.start_timeout_s,
                   what="the engines' policy versions")

    def num_threads(self) -> list[int]:
        return get([e.num_threads.remote() for e in self.engines], timeout_s=self.start_timeout_s,
                   what="the engines' thread counts")

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Ask every engine to release vLLM (all at once, `timeout_s` in all), then kill every actor: a dead or hung
        engine does not stop the others' teardown."""
        try:
            get([e.shutdown.remote() for e in self.engines], timeout_s=timeout_s)
        except Exception as err:  # noqa: BLE001 - a dead or stuck engine is killed below all the same
            print(f"[engines] shutdown: {type(err).__name__}: {str(err).splitlines()[0][:200]}", flush=True)
        for e in self.engines:
            kill(e)


def _renumber(gens: Sequence[Generation], rng: range) -> list[Generation]:
    if len(gens) != len(rng):
        raise RuntimeError(f"engine returned {len(gens)} generations for {len(rng)} prompts")
    return [Generation(prompt_index=rng[k], prompt_token_ids=g.prompt_token_ids, completions=g.completions,
                       vocab_size=g.vocab_size) for k, g in enumerate(gens)]
