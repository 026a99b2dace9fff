"""reward: the hybrid reward of Table 1 and its self-certainty term (Eq. 3-4), and the rules that tie them to the
update (`problems`) and to GRPO's sampling (`grpo_problems`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol

from shop_r1.config.fields import bounded
from shop_r1.config.rollout import RolloutConfig


@dataclass
class SelfCertaintyConfig:
    source: Literal["topk_logprobs", "learner_logits", "update_logits"] = "learner_logits"
    """Where s(r), defined on the model's temperature-1 distribution, comes from:
    `learner_logits`: exact, from the learner's full logits at temperature 1 (one extra no-grad forward of the step's
    batch before the update, shop_r1/learner/grpo_step.py: rationale_self_certainty).
    `update_logits`: the same exact values from the update's own forward (grpo_step.py: grpo_update_with_self_certainty;
    every micro-batch's forward runs before any optimizer step, at the same weights): no extra forward. The learner
    takes the step's whole batch, computes s(r) from its (unscaled) logits, the advantages from the re-formed totals
    with the driver's own function (shop_r1/algo/step_rewards.py), then the loss. Cost against learner_logits (a
    no-grad forward of every row, then forward + backward of the kept rows): with rl.self_certainty_breaks_ties=false
    the dropped zero-signal groups (rl.drop_zero_signal_groups) are known before s(r), so their rows get a no-grad
    forward of their own and the kept rows the forward + backward: learner_logits less the kept rows' no-grad
    forward, always cheaper. With it true (s(r) decides which groups tie) every row forwards with gradient and the
    backward runs through every micro-batch holding a kept row, dropped rows included: with
    rl.drop_zero_signal_groups and many zero-signal groups it can cost more than learner_logits. Costs memory: all
    of a rank's micro-batch graphs (of the rows forwarded with gradient) are alive at once (every forward runs before
    the one backward), so the learner's peak is those rows' activations, not one micro-batch's. Needs
    rl.num_minibatches=1 (a later mini-batch's forward follows an optimizer step) and the Shop-R1 reward (reward.fn
    empty); a plug-in score function given in code trains as under learner_logits, without s(r). One-step-off
    (rl.async_level=1) is fine: the update's forward runs at the weights the extra forward would have.
    `topk_logprobs`: estimated from the top-k logprobs the rollout engine returns (a lower bound on KL(p||U)); the
    engines return the *sampling* distribution's logprobs, so it needs rollout.temperature = 1."""
    direction: Literal["p_to_u", "u_to_p"] = "p_to_u"
    """KL(p||U) as in the paper's Eq. 3, or KL(U||p) as in the self-certainty papers (exact source only)."""
    normalize_by_vocab: bool = False
    """Eq. 3 literally divides by |V|, which shrinks alpha*s below 4e-7 for real vocabularies (a no-op term).
    Off by default: s(r) is the mean per-token KL in nats."""


@dataclass
class RewardFunctionConfig:
    """One entry of `reward.functions`: a reward function of your own and its weight."""

    fn: str = ""
    """"package.module:function", a batched TRL-style reward function: fn(prompts, completions, **columns) -> one
    float per completion, None where it does not apply (shop_r1/reward/functions.py). Its name is its metric,
    `reward/<name>`. The module must be importable on every node."""
    weight: float = 1.0
    """Its values join the total times this weight."""


@dataclass
class RewardConfig:
    dars_factor: float = bounded(1000.0, gt=0)
    """Difficulty-aware reward scaling (Table 1): multiplies ROUGE-L of long-text values (click name, typed text)."""
    alpha: float = bounded(0.005, ge=0)
    """Weight of the self-certainty (rationale) reward, Eq. 4."""
    rouge_threshold: float = bounded(0.75, ge=0, le=1)
    """A value earns its ROUGE-L reward only when ROUGE-L >= this threshold."""
    format_reward: bool = True
    """Table 4 ablation: False gives no 0.5 format reward (valid responses still earn the rest)."""
    rationale_reward: bool = True
    """Table 4 ablation: False drops the self-certainty term from the total."""
    reward_scale: bool = True
    """Table 4 ablation: False sets DARS to 1."""
    action_reward: Literal["hierarchical", "binary"] = "hierarchical"
    """Table 4: 'binary' gives 1.0 for an exact action match (the evaluation rule), else 0."""
    click_guard: bool = False
    """A click earns its ROUGE-L value term only if the predicted name is an element name on the current page and no
    other element name there matches the predicted name better (ROUGE-L) than the target does; otherwise its value is
    0 (action_type and attribute unchanged). Off by default: Table 1 pays any name within the ROUGE threshold, names
    on no page and near-misses of a sibling element included (issue 21: 801 for a name not on the page). Needs each
    prompt's `page_names` (shop_r1/reward/click_guard.py). Not applied to a `reward.fn` of your own."""
    terminate_value: float = bounded(0.0, ge=0, le=1)
    """A correct `terminate` also earns a value term of terminate_value * DARS (as if it were an exactly matched name).
    0 (the paper's Table 1): a correct terminate earns only its 0.3 type reward, nothing beside the DARS-scale value
    of a correct click or query, so under batch-scaled advantages RL learns that stopping is worth nothing and drops
    the terminate answers (issue 21). 1 pays every exactly right action alike, as the evaluation's exact match does
    (with type_value 0: a type_value t pays an exact click or query (1 + t) * DARS, a right terminate still
    terminate_value * DARS). Not applied to `action_reward=binary` (already equal) or to a `reward.fn` of your own."""
    type_value: float = bounded(0.0, ge=0, le=1)
    """A click or type_and_submit of the right type also earns type_value * DARS in its value term, whatever its name
    or text: the type decision on the scale of the name's value, as terminate_value pays a right terminate. 0 (Table
    1): a right type earns 0.3, nothing beside a query's partial ROUGE credit (0.75-0.99 * DARS), so RL drifts toward
    typing on pages where clicks earn only an exact name (issue 21; README "The main job"). A right terminate is paid
    by terminate_value alone. Not applied to `action_reward=binary` or to a `reward.fn` of your own."""
    self_certainty: SelfCertaintyConfig = field(default_factory=SelfCertaintyConfig)
    functions: list[RewardFunctionConfig] = field(default_factory=list)
    """Reward functions of your own *added* to the Shop-R1 terms, each `{fn: "pkg.module:function", weight: w}`
    (TRL's `reward_funcs` shape: batched, prompts + completions + the example's columns -> floats or None). Each is
    loaded and called once on a probe batch before any actor starts; one that cannot be imported or returns the
    wrong number of values is refused, named. `run_grpo(reward_funcs=[...])` takes functions directly."""
    fn: str = ""
    """A per-response scorer that *replaces* the Shop-R1 terms (format, action, self-certainty), as
    "package.module:function", called as fn(response, target, reward_cfg, logprobs) -> RewardBreakdown in the reward
    actors (shop_r1/reward/worker.py: ScoreFn). Empty: the Shop-R1 hybrid reward. To add a term beside the paper's,
    use `reward.functions` instead. The module must be importable on every node."""

    @property
    def effective_dars(self) -> float:
        return self.dars_factor if self.reward_scale else 1.0


def fn_spec_problems(spec: str) -> list[str]:
    """reward.fn's form, "package.module:function" (empty: the Shop-R1 reward). Whether it imports is checked where
    it is loaded (shop_r1/reward/worker.py: load_score_fn): the module is the user's code, imported at the edge."""
    module_name, _, name = spec.partition(":")
    return [f"reward.fn={spec!r}: expected 'package.module:function'"] if spec and (not module_name or not name) \
        else []


class _Sections(Protocol):
    """What the reward rules read of the root Config (which imports this module)."""

    reward: RewardConfig
    rollout: RolloutConfig


def problems(cfg: _Sections, bad: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The reward section's cross-field rules, one line each (`bad`: keys out of their range, whose rules are left
    out)."""
    out = []
    source = cfg.reward.self_certainty.source
    if source == "update_logits" and cfg.reward.fn:
        out.append(f"reward.self_certainty.source=update_logits needs the Shop-R1 reward (reward.fn empty, got "
                   f"{cfg.reward.fn!r}): a plug-in reward's total is its own, s(r) never re-forms it; use "
                   "reward.self_certainty.source=learner_logits")
    for i, entry in enumerate(cfg.reward.functions):
        module_name, _, name = entry.fn.partition(":")
        if not module_name or not name:
            out.append(f"reward.functions[{i}].fn={entry.fn!r}: expected 'package.module:function'")
        if not math.isfinite(entry.weight):
            out.append(f"reward.functions[{i}].weight={entry.weight}: expected a finite number")
    return out + fn_spec_problems(cfg.reward.fn)


def grpo_problems(cfg: _Sections) -> list[str]:
    """What GRPO's sampling asks of the reward, a rule of the GRPO stage only (`reward score` reads no sampling):
    s(r) is defined on the temperature-1 distribution, but the engines return the sampling distribution's logprobs
    (temperature T), so the top-k estimate is only that of s(r) when T = 1."""
    if cfg.reward.self_certainty.source == "topk_logprobs" and cfg.rollout.temperature != 1.0:
        return [f"reward.self_certainty.source=topk_logprobs needs rollout.temperature=1 (got "
                f"{cfg.rollout.temperature}): the engines' top-k logprobs are those of the sampling "
                "distribution; use reward.self_certainty.source=learner_logits (exact, at temperature 1)"]
    return []
