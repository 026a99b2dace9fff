"""data: where the sessions come from, how they are split and how prompts are built from them; the rules of a run
that reads sessions (`check_sessions_source`, `pipeline_problems`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from shop_r1.config.eval import EvalConfig
from shop_r1.config.fields import ConfigError, bounded
from shop_r1.config.rl import RLConfig


@dataclass
class DataConfig:
    sessions_path: str = ""
    """Sessions to train on: a `.jsonl` file (one session a line), a `.parquet` file (one session a row, columns
    `session_id` and `steps`), or a folder written by `datasets`' `save_to_disk` (a Dataset, or a DatasetDict with
    one split or a `train` split). All are validated alike; errors name `FILE:LINE` or `SOURCE row N` (N from 0).
    Empty needs `synthetic: true`: a run is never trained on the toy shop by accident."""
    synthetic: bool = False
    """Ask for the synthetic shop on purpose: with no `sessions_path`, synthesize `synth_num_sessions` sessions with
    `synth_seed` (the laptop demos, the tests, the GPU smoke run). False (the paper's configs): a run with no
    `sessions_path` stops before it starts, naming the key. Setting both is an error."""
    synth_num_sessions: int = bounded(400, ge=1)
    """Sessions the synthetic shop generates when `synthetic` is true."""
    synth_seed: int = 0
    """Seed of the synthetic shop (any int)."""
    synth_version: int = bounded(2, ge=1, le=4)
    """The synthetic shop: 2, shoppers with a profile shown in the prompt and a policy that reads only the profile,
    the page and the session's own actions, so the next action can be known up to `synth_noise`; 3, version 2's
    shoppers and actions with the profile and rationales worded so a small model can copy each fact it needs
    (shop_r1/data/synth/profile.py); 4, version 3 with the searches limit in words of its own ("thrice"), so no
    profile value shares a word with another; 1, the paper-setting shop of the committed Tables 2, 4, 5 and
    Figure 2 (hidden intents and coin flips decide most steps)."""
    synth_noise: float = bounded(0.1, ge=0, le=1)
    """Versions 2-4: the share of steps (after the first) where the shopper does something other than the policy's
    action; an oracle reading only the prompt reaches 1 - synth_noise."""
    persona: bool = True
    """Head every prompt of a session with what is known of its shopper (`persona`: the synthetic profile, or OPeRA's
    persona text), as Customer-R1 does on OPeRA; false leaves it out (the paper's setting)."""
    persona_position: Literal["system", "page"] = "system"
    """Where the persona goes: `system`, the end of the system turn (the top of the prompt); `page`, after the
    current page's HTML in the last user turn, nearest the answer (in `sft_format=session` conversations, after every
    page). A small model trained from scratch copies the profile's facts into its answer only when they are near it
    (README "The main job")."""
    instructions: Literal["full", "short"] = "full"
    """The system turn's instructions: `full` (Appendix B's content, for instruct models) or `short` (the same output
    contract in ~50 tokens instead of ~330, for a model trained from scratch, to which a constant prompt is only
    cost)."""
    val_fraction: float = bounded(0.0, ge=0, lt=1)
    """Share of the *training* sessions carved out as a validation split (`rl_val.jsonl`) for choosing models and
    settings and for the GRPO stage's periodic validation; the test split is read only for the final table."""
    test_fraction: float = bounded(0.1, gt=0, lt=1)
    """Share of sessions held out for evaluation (split by session, never by step)."""
    holdout: str = ""
    """An out-of-distribution split: hold out whole kinds of shoppers or products, `FIELD=VALUE|VALUE|...` over the
    sessions' persona lines (`FIELD: value`; e.g. `Looking for=tent|blender|sandals` on the synthetic shop). Every
    session whose persona has one of the values is held out of training (SFT and RL alike) and no other is; the held-out
    sessions are split between validation and test in the ratio val_fraction : test_fraction (seeded, by session).
    A value that no session has is an error naming this key. Empty: the random split by session (the paper's)."""
    context: Literal["whole_session", "latest_step"] = "whole_session"
    """Table 5: every earlier page's HTML in the prompt, or only the current page plus the action history."""
    history_rationales: bool = True
    """RL prompts: earlier assistant turns carry the session's recorded rationale with the action, so every
    in-context answer has the output format the model must produce. False gives action-only history (the paper's
    wording), which teaches small models in context to drop the rationale (a format failure)."""
    max_prompt_tokens: int = bounded(32512, ge=1)
    """Prompt budget: the paper's 32k context less the answer (rollout.max_new_tokens = 256), since prompt + answer
    must fit the model (`check_context_budget`); the oldest pages' HTML is dropped first to fit. An example whose
    current page alone does not fit is left out of training (and counted)."""
    test_max_prompt_tokens: int = bounded(0, ge=0)
    """Prompt budget of the held-out examples (0: the same as max_prompt_tokens). Set it to the model's context so
    that a small training budget does not filter the held-out set by page length (long result pages)."""
    sft_format: Literal["session", "step"] = "session"
    """SFT data: whole-session conversations with a loss on every assistant turn (the paper's), or one conversation
    per prediction step, built exactly like the RL prompts (same `context`), with the loss on its answer only."""
    rationale_fraction: float = bounded(1.0, ge=0, le=1)
    """Share of the *training* sessions that keep their recorded rationales, chosen by session with the run's seed;
    the others' are dropped before any example is built, as in logs where only a few sessions were annotated
    (Appendix D: a rationale costs an LLM call, an action is logged for free). SFT learns only from steps with a
    rationale (`sft_missing_rationale`); RL's prompts and targets use every session (a history turn without a
    rationale shows the action alone). Validation and test sessions keep theirs. 1: every session (the paper's)."""
    sft_missing_rationale: Literal["skip", "action_only"] = "skip"
    """SFT on a step (or, with `sft_format=session`, a session) with no rationale: `skip` it (counted in the build's
    stats), or `action_only`: train on the action alone (`{"action": ...}`, no rationale), the supervised baseline
    that uses every logged action."""
    balance: bool = True
    """Resample RL examples so click and type_and_submit each occur ~10% more often than terminate (section 4.1)."""
    balance_ratio: float = bounded(1.1, ge=1)
    """How much more often click and type_and_submit occur than terminate after balancing."""
    skip_bad_lines: bool = False
    """Skip and count malformed session lines instead of stopping at the first one."""


def parse_holdout(text: str, key: str = "data.holdout") -> tuple[str, tuple[str, ...]]:
    """`"FIELD=VALUE|VALUE"` as (FIELD, values in order); ("", ()) when empty. A `ConfigError` naming `key` when
    malformed: one `=`, a field name, at least one value, each value once."""
    fmt = "format: FIELD=VALUE|VALUE over the persona's 'FIELD: value' lines, e.g. 'Looking for=tent|blender'"
    if not isinstance(text, str):
        raise ConfigError(f"{key}={text!r}: expected a string ({fmt})")
    if not text.strip():
        return "", ()
    field, sep, rest = text.partition("=")
    values = tuple(v.strip() for v in rest.split("|"))
    if not sep or not field.strip() or not all(values):
        raise ConfigError(f"{key}={text!r}: {fmt}")
    if len(set(values)) != len(values):
        raise ConfigError(f"{key}={text!r}: a value is given twice")
    return field.strip(), values


def problems(cfg: _Sections, bad: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The data section's own rules, one line each."""
    try:
        parse_holdout(cfg.data.holdout)
    except ConfigError as e:
        return [str(e)]
    return []


def sessions_source_problems(data: DataConfig) -> list[str]:
    """A run that reads sessions (`shop-r1 pipeline`) must say where they come from: `data.sessions_path`, or the
    synthetic shop asked for on purpose with `data.synthetic=true`. Not run by `load_config`: `data build`, `sft`
    and `train` read files given on their command lines."""
    if data.sessions_path and data.synthetic:
        return [f"data.sessions_path={data.sessions_path!r} and data.synthetic=true: give one source of sessions "
                "(drop data.synthetic to train on the file)"]
    if not data.sessions_path and not data.synthetic:
        return ["data.sessions_path is empty: give your sessions (data.sessions_path=FILE.jsonl, .parquet or a "
                "datasets folder; README \"Your own sessions\"), or ask for the synthetic shop on purpose with "
                "data.synthetic=true"]
    return []


def check_sessions_source(data: DataConfig) -> None:
    """`sessions_source_problems` as a `ConfigError` (validate(cfg, "pipeline") runs it with the other rules)."""
    problems = sessions_source_problems(data)
    if problems:
        raise ConfigError(problems[0])


class _Sections(Protocol):
    """What the pipeline-split rules read of the root Config (which imports this module)."""

    data: DataConfig
    eval: EvalConfig
    rl: RLConfig


def pipeline_problems(cfg: _Sections) -> list[str]:
    """What the pipeline's own split must give its stages: a validation split (data.val_fraction > 0) for GRPO's
    periodic validation and for evaluating on it. Said before any stage; the pipeline still refuses a split that
    came out empty (a val_fraction too small for the sessions)."""
    out = []
    if cfg.data.val_fraction == 0 and cfg.rl.val_every:
        out.append("rl.val_every > 0 needs a validation split: set data.val_fraction > 0")
    if cfg.data.val_fraction == 0 and cfg.eval.split == "val":
        out.append("eval.split=val needs a validation split: set data.val_fraction > 0")
    return out
