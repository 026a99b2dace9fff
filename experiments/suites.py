"""The experiment suites: their rows (what each trains and evaluates), the paper's numbers beside them, and the
per-seed workspaces of the v2 suites. What a suite is, apart from running it (experiments/run.py) and summarising
it (experiments/summarize.py); experiments/run.py's docstring describes each suite."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shop_r1.config import Config, load_config

V2_SEEDS = (0, 1, 2)
"""The v2 suites' seeds unless --seeds names others: seed k is the workspace ROOT/v2/seed<k> (`seed_workspace`)."""

# The paper's numbers (Qwen-2.5-3B-Instruct; exact match, type accuracy, type macro-F1, in %), for the side by side.
PAPER = {
    "zero_shot": (0.32, 15.33, 16.15), "sft": (16.76, 22.25, 24.52), "sft_rl_binary": (16.55, 23.74, 28.07),
    "shop_r1": (27.72, 36.40, 31.28), "no_format_reward": (2.87, 3.19, 5.04),
    "no_rationale_reward": (26.93, 37.25, 33.74), "no_reward_scale": (27.83, 27.20, 11.70),
    "binary_action_reward": (27.04, 27.46, 12.11), "whole_session/shop_r1": (27.72, 36.40, 31.28),
    "latest_step/shop_r1": (14.74, 30.46, 33.48),
}


@dataclass(frozen=True)
class Row:
    name: str
    label: str
    rl_overrides: tuple[str, ...] | None = None
    """None: no RL (the row evaluates the base or the SFT model, see `model`)."""
    model: str = "rl"
    """"base", "sft", "sft_continued" or "rl": which model the row evaluates."""


@dataclass(frozen=True)
class Suite:
    rows: tuple[Row, ...]
    workspace_overrides: tuple[str, ...] = ()
    """Overrides that change data/SFT (a separate workspace under ROOT/<workspace>)."""
    workspace: str = ""
    plots: tuple[str, ...] = field(default=("reward", "action_mix"))
    notes: tuple[str, ...] = ()
    """What the table should say about its rows (a v2 row measured the other way, or left out as the Shop-R1 run)."""


SFT_ROW = Row("sft", "SFT", model="sft")
SHOP_R1 = Row("shop_r1", "SFT + Shop-R1", ())
BINARY = ("reward.action_reward=binary", "reward.format_reward=false", "reward.rationale_reward=false")
ZERO_SHOT = Row("zero_shot", "Zero-shot (untrained)", model="base")
BINARY_ROW = Row("sft_rl_binary", "SFT + RL (Binary)", BINARY)
SUITES: dict[str, Suite] = {
    "table2": Suite((ZERO_SHOT, SFT_ROW, BINARY_ROW, SHOP_R1)),
    "table4": Suite((SFT_ROW, Row("no_format_reward", "w/o format reward", ("reward.format_reward=false",)),
                     Row("no_rationale_reward", "w/o rationale reward", ("reward.rationale_reward=false",)),
                     Row("no_reward_scale", "w/o reward scale", ("reward.reward_scale=false",)),
                     Row("binary_action_reward", "binary action reward", ("reward.action_reward=binary",)),
                     SHOP_R1)),
    "fig2": Suite((SFT_ROW, *(Row(f"temperature_{t}", f"Shop-R1, T={t}", (f"rollout.temperature={t}",))
                              for t in ("0.2", "0.4", "0.6", "0.8", "1.0")))),
    "vocab": Suite((SFT_ROW, SHOP_R1, Row("normalize_by_vocab", "Shop-R1, s(r)/|V| (Eq. 3 literally)",
                                          ("reward.self_certainty.normalize_by_vocab=true",)))),
    # The same Shop-R1 run with other GRPO seeds (prompt order and sampling; same SFT model): how much of a row is
    # the seed.
    "seeds": Suite((SFT_ROW, SHOP_R1, *(Row(f"shop_r1_seed{k}", f"SFT + Shop-R1, GRPO seed {k}", (f"seed={k}",))
                                        for k in (1, 2)))),
    # sft.max_seq_len=4096: SFT must see prompts as long as GRPO and the evaluation do (the committed table5 result
    # was made before this override, with the base 2400: see experiments/README.md).
    "table5": Suite((SFT_ROW, SHOP_R1), workspace_overrides=("data.context=whole_session",
                                                               "data.max_prompt_tokens=3900", "sft.max_seq_len=4096"),
                    workspace="whole_session_v2"),
}
# fig2's T = 0.6 row is the default Shop-R1 run: reuse it rather than train it twice (v1 suites; the v2 suites name
# the row of the base config's temperature `shop_r1` themselves).
ALIASES = {"temperature_0.6": "shop_r1"}

# ---------------------------------------------------------------------------------------------- v2 suites

SFT_CONTINUED = Row("sft_continued", "SFT continued (RL's wall time)", model="sft_continued")
PAPER_ABLATIONS = SUITES["table4"].rows[1:-1]
TEMPERATURES = ("0.2", "0.4", "0.6", "0.8", "1.0")
V2_SUITES = ("v2_table2", "v2_table4", "v2_fig2", "v2_regime")


def _value(cfg: Config, key: str) -> object:
    out: object = cfg
    for part in key.split("."):
        out = getattr(out, part)
    return out


def _is_set(cfg: Config, override: str) -> bool:
    """Whether `cfg` already has the value `key=value` sets (compared typed, as load_config parses it)."""
    key = override.split("=", 1)[0]
    return _value(cfg, key) == _value(load_config(None, [override]), key)


# Issue 21's reward switches: (key, the value measured, the value measured instead where the base config has it).
SWITCHES = (("reward.click_guard", "true", "false"), ("rl.self_certainty_breaks_ties", "false", "true"),
            ("rl.scale_rewards", "none", "group"))


def _switch(cfg: Config, key: str, measured: str, other: str) -> Row:
    """The row measuring `key=measured` against the base config, or `key=other` where the base already has
    `measured` (the main job may adopt a switch that an ablation supported; the row then measures leaving it)."""
    value = other if _is_set(cfg, f"{key}={measured}") else measured
    return Row(f"{key.rsplit('.', 1)[1]}_{value}", f"Shop-R1, {key}={value}", (f"{key}={value}",))


def v2_suite(name: str, cfg: Config) -> Suite:
    """A v2 suite's rows for the base config `cfg` (any seed's: the rows do not depend on the seed). An RL row whose
    overrides the base config already has would repeat the Shop-R1 run: fig2 names it `shop_r1`, others leave it out."""
    notes: tuple[str, ...] = ()
    if name == "v2_table2":
        rows: tuple[Row, ...] = (ZERO_SHOT, SFT_ROW, SFT_CONTINUED, BINARY_ROW, SHOP_R1)
        if not cfg.eval.zero_shot:  # the main job's own choice (a from-scratch model writes no JSON untrained)
            rows = rows[1:]
            notes += (f"{ZERO_SHOT.label}: left out, the base config has eval.zero_shot=false",)
    elif name == "v2_regime":  # issue 47: a regime's (the base config + its overrides) RL stage against more SFT
        rows = (SFT_ROW, SFT_CONTINUED, SHOP_R1)
    elif name == "v2_table4":
        switches = tuple(_switch(cfg, *s) for s in SWITCHES)
        notes = tuple(f"{r.label}: the base config has {key}={measured}, so this row measures the other value"
                      for r, (key, measured, _) in zip(switches, SWITCHES) if r.rl_overrides != (f"{key}={measured}",))
        rows = (SFT_ROW, *PAPER_ABLATIONS, *switches, SHOP_R1)
    elif name == "v2_fig2":
        rows = (SFT_ROW, *(Row("shop_r1", f"Shop-R1, T={t}", ()) if _is_set(cfg, f"rollout.temperature={t}") else
                           Row(f"temperature_{t}", f"Shop-R1, T={t}", (f"rollout.temperature={t}",))
                           for t in TEMPERATURES))
        if not any(r.name == "shop_r1" for r in rows):
            rows += (Row("shop_r1", f"Shop-R1, T={cfg.rollout.temperature:g} (base config)", ()),)
    else:
        raise KeyError(f"no v2 suite {name!r}; v2 suites: {', '.join(V2_SUITES)}")
    kept = tuple(r for r in rows if not (r.rl_overrides and all(_is_set(cfg, o) for o in r.rl_overrides)))
    notes += tuple(f"{r.label}: left out, the base config already has {' '.join(r.rl_overrides or ())} (it is the "
                   "Shop-R1 run)" for r in rows if r not in kept)
    return Suite(kept, workspace="v2", notes=notes)


def seed_workspace(root: Path, k: int) -> Path:
    return root / "v2" / f"seed{k}"
