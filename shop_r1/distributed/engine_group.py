"""A group of rollout engines, one per Ray actor, that splits a batch of prompts and gathers results in order.

`generate_scored` streams: each engine's share is sent as a few chunks, and every chunk goes to the reward pool the
moment it comes back, so scoring overlaps generation instead of waiting for the whole batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from shop_r1.config import RolloutConfig
from shop_r1.distributed.actors import Resources, get, kill, spawn, wait_first
from shop_r1.distributed.reward_pool import RewardPool
from shop_r1.types import Generation, Prompt, SamplingSpec, ScoredGeneration, ScoreRequest

GENERATE_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class ScoredBatch:
    scored: list[ScoredGeneration]
    generate_s: float
    """Until the last engine returned (scoring of earlier chunks overlaps this)."""
    reward_wait_s: float
    """Scoring time not hidden behind generation."""


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
        resources = Resources(num_cpus=cfg.num_cpus_per_engine, num_gpus=cfg.num_gpus_per_engine)
        # Each engine gets its own sampling seed so the group does not draw the same samples on every engine.
        self.engines = [spawn(engine_cls, model_path, cfg, max_model_len, seed + 1000 * i, local=local,
                              resources=resources) for i in range(cfg.num_engines)]
        self.chunks_per_engine = 2

    def _chunks(self, num_prompts: int) -> list[tuple[Any, range]]:
        """(engine, prompt range) pairs: each engine's contiguous share, cut into `chunks_per_engine` pieces."""
        out = []
        for engine, share in zip(self.engines, split_evenly(num_prompts, len(self.engines))):
            for piece in split_evenly(len(share), self.chunks_per_engine):
                out.append((engine, range(share.start + piece.start, share.start + piece.stop)))
        return out

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Generation]:
        """All prompts' generations in the prompts' order (prompt_index renumbered to the batch position)."""
        chunks = self._chunks(len(prompt_token_ids))
        refs = [engine.generate.remote([list(prompt_token_ids[i]) for i in rng], spec) for engine, rng in chunks]
        out: list[Generation] = []
        for (_, rng), gens in zip(chunks, get(refs, timeout_s=GENERATE_TIMEOUT_S)):
            out.extend(_renumber(gens, rng))
        return out

    def generate_scored(self, prompts: Sequence[Prompt], spec: SamplingSpec, pool: RewardPool) -> ScoredBatch:
        """Generate, and score each chunk as soon as its engine returns it. Results in the prompts' order."""
        start = time.perf_counter()
        chunks = self._chunks(len(prompts))
        pending = {engine.generate.remote([list(prompts[i].token_ids) for i in rng], spec): rng
                   for engine, rng in chunks}
        tickets = []
        while pending:
            ready, _ = wait_first(list(pending), timeout_s=GENERATE_TIMEOUT_S)
            if not ready:
                raise TimeoutError(f"no engine returned a generation within {GENERATE_TIMEOUT_S}s")
            for ref in ready:
                rng = pending.pop(ref)
                gens = _renumber(get(ref), rng)
                requests = [ScoreRequest(c.text, prompts[g.prompt_index].target, c.token_logprobs(g.vocab_size))
                            for g in gens for c in g.completions]
                tickets.append((gens, pool.submit(requests)))
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
        tensors = list(named_tensors)
        get([e.load_weights.remote(tensors, version) for e in self.engines], timeout_s=GENERATE_TIMEOUT_S)

    def set_policy_version(self, version: int) -> None:
        """Stamp every engine with `version` without new weights (after an update that changed nothing)."""
        get([e.set_policy_version.remote(version) for e in self.engines], timeout_s=GENERATE_TIMEOUT_S)

    def policy_versions(self) -> list[int]:
        return get([e.policy_version.remote() for e in self.engines])

    def vocab_size(self) -> int:
        return get(self.engines[0].vocab_size.remote())

    def shutdown(self) -> None:
        get([e.shutdown.remote() for e in self.engines])
        for e in self.engines:
            kill(e)


def _renumber(gens: Sequence[Generation], rng: range) -> list[Generation]:
    if len(gens) != len(rng):
        raise RuntimeError(f"engine returned {len(gens)} generations for {len(rng)} prompts")
    return [Generation(prompt_index=rng[k], prompt_token_ids=g.prompt_token_ids, completions=g.completions,
                       vocab_size=g.vocab_size) for k, g in enumerate(gens)]
