"""Per-step rollout metrics: every reward term's mean, the action-type mix of the samples, lengths, failures.

The action-type mix makes the paper's failure mode visible at a glance: a policy collapsing onto `terminate`
(Tables 3-4) shows as `rollout/type_terminate` rising towards 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from shop_r1.reward.failures import failure_counts
from shop_r1.types import ACTION_TYPES, ScoredGeneration

REWARD_TERMS = ("format", "action_type", "attribute", "value", "self_certainty", "total")


def rollout_metrics(scored: Sequence[ScoredGeneration]) -> dict[str, float]:
    rewards = [r for s in scored for r in s.rewards]
    completions = [c for s in scored for c in s.generation.completions]
    n = max(len(rewards), 1)
    out = {f"reward/{k}": sum(getattr(r, k) for r in rewards) / n for k in REWARD_TERMS}
    out.update(failure_counts(rewards))  # reward/num_failed, and per cause: timeout, crash, scorer error
    # The reward stage's parse; a response whose scoring failed counts as invalid (it earned 0, see num_failed).
    types = [r.parsed.action.type if r.parsed is not None else "invalid" for r in rewards]
    for kind in (*ACTION_TYPES, "invalid"):
        out[f"rollout/type_{kind}"] = types.count(kind) / n
    lengths = [len(c.token_ids) for c in completions]
    out["rollout/response_tokens_mean"] = sum(lengths) / n
    out["rollout/response_tokens_max"] = float(max(lengths, default=0))
    out["rollout/truncated_fraction"] = sum(c.finish_reason == "length" for c in completions) / n
    return out
