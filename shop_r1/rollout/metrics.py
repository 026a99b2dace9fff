"""Per-step rollout metrics: every reward term's mean, the action-type mix of the samples, lengths; and the periodic
validation's figures (`rl.val_every`). The failure counts (`reward/num_failed*`) come from the batch's one
`RewardFailures` record (shop_r1/reward/failures.py), which the driver's failure check reads too.

The action-type mix makes the paper's failure mode visible at a glance: a policy collapsing onto `terminate`
(Tables 3-4) shows as `rollout/type_terminate` rising towards 1; on the fixed validation subset, as `val/kappa`
falling towards 0 while `val/pred_terminate` rises.
"""

from __future__ import annotations

from collections.abc import Sequence

from shop_r1.metrics import PREDICTED_KINDS, compute_metrics
from shop_r1.reward.functions import term_metrics
from shop_r1.types import ACTION_TYPES, Action, ScoredGeneration

REWARD_TERMS = ("format", "action_type", "attribute", "value", "self_certainty", "total")


def rollout_metrics(scored: Sequence[ScoredGeneration]) -> dict[str, float]:
    rewards = [r for s in scored for r in s.rewards]
    completions = [c for s in scored for c in s.generation.completions]
    n = max(len(rewards), 1)
    out = {f"reward/{k}": sum(getattr(r, k) for r in rewards) / n for k in REWARD_TERMS}
    out.update(term_metrics(rewards))  # the plug-in reward functions' reward/<name> (shop_r1/reward/functions.py)
    # The reward stage's parse; a response whose scoring failed counts as invalid (it earned 0, see num_failed).
    types = [r.parsed.action.type if r.parsed is not None else "invalid" for r in rewards]
    for kind in (*ACTION_TYPES, "invalid"):
        out[f"rollout/type_{kind}"] = types.count(kind) / n
    lengths = [len(c.token_ids) for c in completions]
    out["rollout/response_tokens_mean"] = sum(lengths) / n
    out["rollout/response_tokens_max"] = float(max(lengths, default=0))
    out["rollout/truncated_fraction"] = sum(c.finish_reason == "length" for c in completions) / n
    return out


def validation_metrics(responses: Sequence[str], targets: Sequence[Action]) -> dict[str, float]:
    """The `val/*` figures of greedy answers to the validation subset, by the evaluation's rules (shop_r1.metrics):
    exact match, Cohen's kappa of predicted vs target type, type accuracy, exact match on non-terminate targets, and
    the predicted-type mix (`val/pred_<type>`, `val/pred_invalid` for answers that do not parse)."""
    m = compute_metrics(responses, targets)
    out = {"val/exact": m.exact_match, "val/kappa": m.type_kappa, "val/type_accuracy": m.type_accuracy,
           "val/exact_non_terminate": m.exact_match_non_terminate, "val/n": float(m.n)}
    out.update({f"val/pred_{kind}": (m.predicted_mix or {}).get(kind, 0.0) for kind in PREDICTED_KINDS})
    return out
