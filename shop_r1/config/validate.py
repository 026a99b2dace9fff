"""`validate`: every rule of a run, checked once before any actor starts.

The config alone decides most of them (`check_ranges`, which `load_config` runs: the bounds and each section's
`problems`). The rest need what the run is given, passed to `validate`: the stage (`stage`: the sessions source
and the pipeline's split are the pipeline's; GRPO's sampling and weight transport are the GRPO stages'), the
model's context (`max_model_len`: the token budgets), the prompts (`prompts`, `val_prompts`) and whether the run
is in one process (`local`). A rule whose input is not given is not checked. What only the user's code or the run
folder can say is checked where it is read: an importable reward.fn (shop_r1/reward/worker.py: load_score_fn), a
resumed run's config (shop_r1/run_config.py: check_resume).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from shop_r1.config import data, reward, weight_sync
from shop_r1.config.core import Config, check_ranges
from shop_r1.config.fields import ConfigError

if TYPE_CHECKING:
    from shop_r1.types import Prompt

Stage = Literal["pipeline", "sft", "train", "eval"]
"""What runs: the main job (every stage), or one of `shop-r1 sft`, `train` (GRPO), `eval run`."""
BUDGETS: dict[str, tuple[Literal["sft", "rl", "eval"], ...]] = {
    "pipeline": ("sft", "rl", "eval"), "sft": ("sft",), "train": ("rl",), "eval": ("eval",)}
"""The token budgets each stage's run must fit into the model's context (`check_context_budget`)."""


def validate(cfg: Config, stage: Stage, *, max_model_len: int | None = None, prompts: Sequence[Prompt] | None = None,
             val_prompts: Sequence[Prompt] | None = None, local: bool | None = None,
             extra_problems: Sequence[str] = ()) -> None:
    """Raise one `ConfigError` listing every broken rule of `stage`'s run (see the module's docstring); `local`
    None: ray.local_mode. Cheap (no model, no Ray): a caller that learns more later (the pipeline, its model) may
    call it again with it. `extra_problems`: what the caller found of the user's own code, in the same error (run_grpo:
    the reward functions, shop_r1/reward/functions.py: reward_function_problems; the config never imports it)."""
    check_ranges(cfg)  # a Config built or edited in code gets the same checks as a loaded one
    problems = []
    if stage == "pipeline":
        problems += data.sessions_source_problems(cfg.data) + data.pipeline_problems(cfg)
    if stage in ("pipeline", "train"):
        problems += reward.grpo_problems(cfg)
        problems += weight_sync.grpo_problems(cfg, cfg.ray.local_mode if local is None else local)
    if max_model_len is not None:
        problems += context_budget_problems(cfg, max_model_len, BUDGETS[stage])
    if prompts is not None:
        problems += prompt_problems(cfg, prompts, val_prompts)
    problems += list(extra_problems)
    if problems:
        raise ConfigError("\n".join(problems))


def prompt_problems(cfg: Config, prompts: Sequence[Prompt], val_prompts: Sequence[Prompt] | None) -> list[str]:
    """What the GRPO settings need of the prompts the run was given (was shop_r1/train.py: check_prompts)."""
    out = []
    if cfg.rl.val_every and not val_prompts:
        out.append(f"rl.val_every={cfg.rl.val_every} needs validation prompts (run_grpo's val_prompts, from a "
                   "validation split); set rl.val_every=0 to train without periodic validation")
    if cfg.reward.click_guard and any(p.page_names is None for p in prompts):
        out.append("reward.click_guard=true needs each prompt's page_names (the current page's element names: "
                   "shop_r1/data/pages.py: page_element_names); these prompts have none")
    return out


def check_context_budget(cfg: Config, max_model_len: int,
                         stages: tuple[Literal["sft", "rl", "eval"], ...] = ("sft", "rl", "eval")) -> None:
    """`context_budget_problems` as one `ConfigError` (validate runs it when given `max_model_len`)."""
    problems = context_budget_problems(cfg, max_model_len, stages)
    if problems:
        raise ConfigError("\n".join(problems))


def context_budget_problems(cfg: Config, max_model_len: int,
                            stages: tuple[Literal["sft", "rl", "eval"], ...] = ("sft", "rl", "eval")) -> list[str]:
    """Every token budget of `stages` that does not fit the model's context,
    `max_model_len` (shop_r1/rollout/engine.py: max_model_len(cfg, model), the smaller of model.max_context_tokens
    and the model's positions), naming the keys to change:

    - rl: data.max_prompt_tokens + rollout.max_new_tokens (training prompts and their answers) and, with
      rl.val_every > 0, the held-out prompt budget + rollout.max_new_tokens (validation answers);
    - eval: the held-out prompt budget (data.test_max_prompt_tokens, 0: data.max_prompt_tokens) + eval.max_new_tokens;
    - sft: sft.max_seq_len.

    Without it, a prompt over the budget is found only when it is encoded (shop_r1/data/encode.py), after the data
    build. Not run by `load_config`: it needs the model (the paper's defaults, 32768 + 256, fit no 32k model)."""
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise ValueError(f"max_model_len={max_model_len!r}: expected the model's context length, an int >= 1")
    n, d = max_model_len, cfg.data
    context = (f"the model's context of {n} tokens (model.max_context_tokens={cfg.model.max_context_tokens}, "
               "capped by the model's own positions)")
    held_out = ("data.test_max_prompt_tokens", d.test_max_prompt_tokens) if d.test_max_prompt_tokens else \
        ("data.max_prompt_tokens", d.max_prompt_tokens)
    pairs = []  # (prompt key, prompt budget, answer key, answer budget)
    if "rl" in stages:
        pairs.append(("data.max_prompt_tokens", d.max_prompt_tokens, "rollout.max_new_tokens",
                      cfg.rollout.max_new_tokens))
        if cfg.rl.val_every:
            pairs.append((*held_out, "rollout.max_new_tokens", cfg.rollout.max_new_tokens))
    if "eval" in stages:
        pairs.append((*held_out, "eval.max_new_tokens", cfg.eval.max_new_tokens))
    problems = []
    for prompt_key, prompt, answer_key, answer in dict.fromkeys(pairs):  # the same pair once
        if prompt + answer <= n:
            continue
        fix = f"set {prompt_key} <= {n - answer} or lower {answer_key}" if answer < n else \
            f"lower {answer_key} below {n} (and {prompt_key} to fit the rest)"
        problems.append(f"{prompt_key}={prompt} + {answer_key}={answer} = {prompt + answer} tokens do not fit "
                        f"{context}: {fix}")
    if "sft" in stages and cfg.sft.max_seq_len > n:
        problems.append(f"sft.max_seq_len={cfg.sft.max_seq_len} does not fit {context}: set sft.max_seq_len <= {n}")
    return problems

