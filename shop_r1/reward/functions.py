"""Reward functions in TRL's shape, added to the Shop-R1 reward with weights (`reward.functions`, `run_grpo(...,
reward_funcs=[...])`).

A reward function is batched: it is called once per chunk of responses the reward actors score, as

    fn(prompts=[Prompt, ...], completions=["...", ...], target=[Action, ...], page_names=[...], example_id=[...],
       logprobs=[TokenLogprobs | None, ...])   # logprobs only when fn has a `logprobs` parameter (it asks for them)

(TRL's `reward_funcs`: prompts, completions, then the example's columns as keyword arguments, so `**kwargs` takes
the ones it does not name) and returns one float per completion, or None where it does not apply. Prompts are the
encoded `Prompt` records (token ids, example id, target): the reward actors hold no tokenizer. Its weighted value
joins the response's total: total = the Shop-R1 terms (`DEFAULT_TERMS`, or a `reward.fn`'s total) + sum of
weight * value over the functions whose value is not None. Its name (`fn.__name__`) is its metric: `reward/<name>`
is its mean over the responses it applied to, `reward/<name>_applied` the share of them.

The paper's hybrid reward is the default list, each term one such function: format, the hierarchical action
reward with DARS (Table 1) and the rationale's self-certainty, weighted 1, 1 and alpha (`default_terms`). The
reward actors compute those three in one pass per response (`score_response`, the same numbers: tested), since
they share the parse and the learner may replace s(r) by its exact value later.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shop_r1.config import ConfigError, RewardConfig
from shop_r1.reward.scorer import score_response
from shop_r1.types import Action, Prompt, RewardBreakdown, ScoreRequest, TermValue

RewardFunction = Callable[..., Sequence["float | None"]]
"""fn(prompts, completions, **columns) -> one float (or None: does not apply) per completion."""


@dataclass(frozen=True)
class RewardTerm:
    """One reward function with its weight; `name` is its metric (`reward/<name>`)."""

    name: str
    fn: RewardFunction
    weight: float = 1.0


class RewardFunctionError(ValueError):
    """A reward function broke its contract (wrong number or type of values): a bug in it, not a bad response."""


def asks_for_logprobs(fn: RewardFunction) -> bool:
    """Whether `fn` names a `logprobs` parameter (engine logprobs are passed only to a function that asks)."""
    try:
        return "logprobs" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: it is not passed them
        return False


def call_term(term: RewardTerm, requests: Sequence[ScoreRequest]) -> list[float | None]:
    """The function's values for `requests`, in order, checked: one per completion, each a finite float or None."""
    columns: dict[str, Any] = {"target": [r.target for r in requests], "page_names": [r.page_names for r in requests],
                               "example_id": [r.prompt.example_id if r.prompt is not None else "" for r in requests]}
    if asks_for_logprobs(term.fn):
        columns["logprobs"] = [r.logprobs for r in requests]
    prompts = [r.prompt if r.prompt is not None else Prompt("", (), r.target, r.page_names) for r in requests]
    values = term.fn(prompts=prompts, completions=[r.response for r in requests], **columns)
    return checked_values(term.name, values, len(requests))


def checked_values(name: str, values: Any, expected: int) -> list[float | None]:
    try:
        values = list(values)
    except TypeError:
        raise RewardFunctionError(f"reward function {name!r} returned {type(values).__name__}, expected a list of "
                                  f"{expected} floats (None: does not apply)") from None
    if len(values) != expected:
        raise RewardFunctionError(f"reward function {name!r} returned {len(values)} values for {expected} "
                                  "completions: it must return one per completion (None where it does not apply)")
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
        else:
            raise RewardFunctionError(f"reward function {name!r}: value {i} is {v!r}, expected a float or None")
    return out


def with_terms(rewards: Sequence[RewardBreakdown], values: Sequence[Sequence[float | None]],
               terms: Sequence[RewardTerm]) -> list[RewardBreakdown]:
    """Each breakdown with the functions' values (`values[k][i]`: term k, response i) in `terms` and their weighted
    sum added to its total (a None adds nothing)."""
    out = []
    for i, r in enumerate(rewards):
        own = tuple(TermValue(t.name, values[k][i], t.weight) for k, t in enumerate(terms))
        extra = sum((v.weighted for v in own), 0.0)
        out.append(dataclasses.replace(r, terms=r.terms + own, total=r.total + extra))
    return out


def term_metrics(rewards: Sequence[RewardBreakdown]) -> dict[str, float]:
    """`reward/<name>`: each plug-in function's mean over the responses it applied to (0 where none),
    `reward/<name>_applied`: the share of responses it applied to (its non-None values)."""
    seen: dict[str, list[float | None]] = {}
    for r in rewards:
        for t in r.terms:
            seen.setdefault(t.name, []).append(t.value)
    out = {}
    for name, vs in seen.items():
        applied = [v for v in vs if v is not None]
        out[f"reward/{name}"] = sum(applied) / len(applied) if applied else 0.0
        out[f"reward/{name}_applied"] = len(applied) / max(len(rewards), 1)
    return out


# ------------------------------------------------------------------------------------ the paper's terms as functions
def default_terms(cfg: RewardConfig) -> tuple[RewardTerm, ...]:
    """The Shop-R1 hybrid reward (Eq. 4) as the default list: format (weight 1), the hierarchical action reward with
    DARS (action_type + attribute + value, weight 1) and the rationale's self-certainty s(r) (weight alpha; 0 under
    the `rationale_reward=false` ablation). A format-invalid response scores 0 in each."""

    def breakdowns(completions: Sequence[str], target: Sequence[Action], page_names: Sequence[Any],
                   logprobs: Sequence[Any] | None) -> list[RewardBreakdown]:
        logprobs = logprobs if logprobs is not None else [None] * len(completions)
        return [score_response(c, t, cfg, lp, names) for c, t, lp, names in zip(completions, target, logprobs,
                                                                                  page_names)]

    def format(prompts, completions, target, page_names, logprobs=None, **_):  # noqa: A001 - Table 1's name
        return [r.format for r in breakdowns(completions, target, page_names, logprobs)]

    def action(prompts, completions, target, page_names, logprobs=None, **_):
        return [r.action_type + r.attribute + r.value for r in breakdowns(completions, target, page_names, logprobs)]

    def self_certainty(prompts, completions, target, page_names, logprobs=None, **_):
        return [r.self_certainty for r in breakdowns(completions, target, page_names, logprobs)]

    return (RewardTerm("format", format, 1.0), RewardTerm("action", action, 1.0),
            RewardTerm("self_certainty", self_certainty, cfg.alpha if cfg.rationale_reward else 0.0))


# ------------------------------------------------------------------------------------------- loading and checking
def load_reward_function(spec: str, key: str = "reward.functions") -> RewardFunction:
    """"package.module:function" -> the function; a ConfigError naming it when it cannot be imported or called."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ConfigError(f"{key}: fn={spec!r}: expected 'package.module:function'")
    return import_callable(spec, f"{key}: fn={spec!r}")


def import_callable(spec: str, label: str) -> Callable[..., Any]:
    """The callable a well-formed "package.module:function" names (reward.functions' and reward.fn's loader); a
    ConfigError starting with `label` when it cannot be imported or is not callable."""
    from importlib import import_module

    module_name, _, name = spec.partition(":")
    try:
        fn = getattr(import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{label}: cannot load it ({type(e).__name__}: {e})") from None
    if not callable(fn):
        raise ConfigError(f"{label}: {type(fn).__name__} is not callable")
    return fn


def terms_of(cfg: RewardConfig, reward_funcs: Sequence[RewardFunction | RewardTerm] = ()) -> tuple[RewardTerm, ...]:
    """The plug-in functions of a run: `reward.functions` (loaded by import path), then those given in code
    (`run_grpo(reward_funcs=...)`: a function, weight 1, or a RewardTerm). Refused (ConfigError, naming it) when one
    cannot be loaded, is not callable, or two share a metric name."""
    out = [RewardTerm(fn_name(f), f, entry.weight) for entry in cfg.functions
           for f in [load_reward_function(entry.fn, f"reward.functions: {entry.fn}")]]
    for f in reward_funcs:
        if isinstance(f, RewardTerm):
            out.append(f)
        elif callable(f):
            out.append(RewardTerm(fn_name(f), f, 1.0))
        else:
            raise ConfigError(f"reward_funcs: {f!r} is not callable")
    names = [t.name for t in out]
    taken = {"format", "action_type", "attribute", "value", "self_certainty", "total", "num_failed"}
    clash = sorted({n for n in names if names.count(n) > 1 or n in taken})
    if clash:
        raise ConfigError(f"reward functions {clash}: each needs its own metric name (reward/<name>), not one of "
                          f"the Shop-R1 terms' {sorted(taken)} nor another function's: rename the function")
    return tuple(out)


def fn_name(fn: RewardFunction) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def check_terms(terms: Sequence[RewardTerm], prompts: Sequence[Prompt]) -> list[str]:
    """Each function called once on a probe batch (the first prompts, each with its target written as the answer):
    one line per function that raises or does not return one value per completion (run before any actor starts)."""
    from shop_r1.data.prompts import render_action

    probe = [ScoreRequest(render_action(p.target, "probe"), p.target, None, p.page_names, p)
             for p in list(prompts)[:2]]
    if not probe:
        probe = [ScoreRequest(render_action(Action("terminate"), "probe"), Action("terminate"))]
    out = []
    for t in terms:
        if not math.isfinite(t.weight):
            out.append(f"reward function {t.name!r}: weight {t.weight} is not finite")
        try:
            call_term(t, probe)
        except RewardFunctionError as e:
            out.append(str(e))
        except Exception as e:  # noqa: BLE001 - the user's code, reported by name before any actor starts
            out.append(f"reward function {t.name!r} raised on a probe batch of {len(probe)} completions "
                       f"({type(e).__name__}: {e})")
    return out


def reward_function_problems(cfg: RewardConfig, prompts: Sequence[Prompt],
                             reward_funcs: Sequence[RewardFunction | RewardTerm] = ()) -> list[str]:
    """The plug-in reward functions (`reward.functions` + `reward_funcs`), each imported and called once on a probe
    batch of the first prompts: one line per function that cannot be imported, is not callable, shares a metric name,
    raises, or returns the wrong number of values (`check_terms`). The user's code, run at the edge: run_grpo passes
    these to the config's `validate` (which never imports this module)."""
    if not cfg.functions and not reward_funcs:
        return []
    try:
        terms = terms_of(cfg, reward_funcs)
    except ConfigError as e:
        return [str(e)]
    return check_terms(terms, prompts)
