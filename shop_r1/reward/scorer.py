"""The hybrid reward of one response (Table 1 + Eq. 4):

    total = format + action_type + attribute + value + alpha * self_certainty

- format: 0.5 for a format-valid response (0 under the `format_reward=false` ablation; valid responses still earn
  the rest). A format-invalid response scores 0 in every term.
- action_type / attribute / value: `action_reward` (hierarchical, or binary under the ablation; a click's value
  checked against the page's element names under `reward.click_guard`).
- self_certainty: s(r) from the engine's top-k logprobs, reported whenever logprobs are given; it enters the total
  only when `rationale_reward` is on. Without logprobs it is 0. (With `source=learner_logits` the learner computes
  s(r) exactly and re-forms the total; see the GRPO loop.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from shop_r1.config import RewardConfig
from shop_r1.reward.action import action_reward
from shop_r1.reward.format import parse_response
from shop_r1.reward.self_certainty import self_certainty
from shop_r1.types import Action, ParsedResponse, RewardBreakdown, TokenLogprobs

FORMAT_REWARD = 0.5


def combine(fmt: float, action_type: float, attribute: float, value: float, s: float, cfg: RewardConfig,
            format_valid: bool, parsed: ParsedResponse | None = None) -> RewardBreakdown:
    """Assemble the breakdown and its total (also used when s(r) is replaced by an exact value)."""
    certainty_term = cfg.alpha * s if cfg.rationale_reward else 0.0
    return RewardBreakdown(format=fmt, action_type=action_type, attribute=attribute, value=value,
                           self_certainty=s, total=fmt + action_type + attribute + value + certainty_term,
                           format_valid=format_valid, parsed=parsed)


def score_response(response: str, target: Action, cfg: RewardConfig,
                   logprobs: TokenLogprobs | None = None,
                   page_names: Sequence[str] | None = None) -> RewardBreakdown:
    """`page_names`: the current page's element names, needed by `reward.click_guard` only."""
    parsed = parse_response(response)
    if parsed is None:
        return RewardBreakdown(format_valid=False)
    act = action_reward(parsed.action, target, cfg, page_names)
    s = 0.0
    if logprobs is not None and cfg.self_certainty.source == "topk_logprobs":
        s = self_certainty(logprobs, parsed.rationale_span, len(response), cfg.self_certainty)
    fmt = FORMAT_REWARD if cfg.format_reward else 0.0
    return combine(fmt, act.action_type, act.attribute, act.value, s, cfg, format_valid=True, parsed=parsed)


def with_exact_self_certainty(rewards: Sequence[RewardBreakdown], values: Sequence[float], cfg: RewardConfig
                              ) -> list[RewardBreakdown]:
    """Replace each response's s(r) by the learner's exact value (`values[i]` for `rewards[i]`, one per response,
    format-invalid ones included) and move its total by alpha * (new - old). A format-invalid response keeps 0."""
    if len(values) != len(rewards):
        raise ValueError(f"{len(values)} self-certainty values for {len(rewards)} responses")
    out = []
    for r, s in zip(rewards, values):
        if not r.format_valid:
            out.append(r)
            continue
        weight = cfg.alpha if cfg.rationale_reward else 0.0
        out.append(dataclasses.replace(r, self_certainty=s, total=r.total + weight * (s - r.self_certainty)))
    return out
