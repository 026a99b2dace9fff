"""What a rollout step leaves for people and audits: the per-sample dump (`rollouts.jsonl`) and the policy-version
check of the engines' stamps.

One JSON line per group (prompt): the example id and the prompt's token ids once, then per sample the response text
and token ids, the engine's logprobs of the sampled tokens (at the sampling temperature), the reward breakdown, the
advantage, the policy version the engine stamped on it and the policy lag (step - 1 - version: 0 when synchronous,
at most 1 with rl.async_level=1). The same role as TRL's `log_completions` and verl's
rollout dump; every figure of a step can be recomputed from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shop_r1.types import ScoredGeneration


def rollout_records(step: int, scored: Sequence[ScoredGeneration], advantages: Sequence[Sequence[float]]
                    ) -> list[dict[str, Any]]:
    """advantages[p][g] belongs to scored[p].generation.completions[g]."""
    out = []
    for s, group_adv in zip(scored, advantages):
        samples = []
        for c, r, a in zip(s.generation.completions, s.rewards, group_adv):
            samples.append({"text": c.text, "token_ids": list(c.token_ids), "logprobs": list(c.logprobs),
                            "finish_reason": c.finish_reason, "reward": {**r.to_dict(), "format_valid": r.format_valid,
                                                                         "error": r.error},
                            "advantage": float(a), "policy_version": c.policy_version,
                            "policy_lag": step - 1 - c.policy_version})
        out.append({"step": step, "example_id": s.prompt.example_id,
                    "prompt_token_ids": list(s.generation.prompt_token_ids), "samples": samples})
    return out


class PolicyVersionMismatch(RuntimeError):
    """Samples were drawn with weights other than the learner's current ones (a lost or stale weight sync)."""


def check_policy_versions(scored: Sequence[ScoredGeneration], expected: int) -> int:
    """The version every engine stamped on this step's samples; raises when any differs from `expected` (the
    version pushed to the engines before this rollout started), naming the example and the versions found."""
    found = {}
    for s in scored:
        for c in s.generation.completions:
            found.setdefault(c.policy_version, s.prompt.example_id)
    if found and set(found) != {expected}:
        stale = {v: ex for v, ex in found.items() if v != expected}
        raise PolicyVersionMismatch(f"engines sampled with policy versions {sorted(found)} but the learner is at "
                                    f"version {expected} (first stale sample per version: {stale}); the weight "
                                    "sync did not reach every engine")
    return expected
