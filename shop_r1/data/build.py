"""`shop-r1 data build`: sessions -> held-out split -> SFT conversations + RL examples, written as JSONL.

The split is by session (no step of a test session is ever trained on); `data.val_fraction` carves a validation
split out of the training sessions, for choosing models and settings without reading the test split. Balancing
(section 4.1) applies to the training RL examples only; the test and validation sets keep their natural action mix,
as the paper's Table A1 test split does.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from shop_r1.config import DataConfig
from shop_r1.config.data import parse_holdout
from shop_r1.data.examples import (
    balance_rl_examples,
    build_rl_examples,
    build_sft_examples,
    build_step_sft_examples,
    chat_token_counter,
    drop_rationales,
    type_counts,
    write_examples_jsonl,
)
from shop_r1.data.sessions import SessionSplit, holdout_split, load_sessions, split_sessions
from shop_r1.data.stats import RLExampleStats, SessionStats, rl_example_stats, session_stats
from shop_r1.errors import DataError


@dataclass(frozen=True)
class BuiltDatasets:
    out_dir: str
    sft_train_path: str
    rl_train_path: str
    rl_test_path: str
    num_bad_lines: int
    train_sessions: SessionStats
    test_sessions: SessionStats
    num_sft_train: int
    num_sft_skipped: int
    """Sessions left out of SFT because a step lacks a rationale."""
    num_rl_over_budget: int
    """Training RL examples left out because the current page alone exceeds data.max_prompt_tokens."""
    num_rl_test_over_budget: int
    """Held-out RL examples left out because the current page alone exceeds the test budget
    (data.test_max_prompt_tokens, else data.max_prompt_tokens); 0 unless the model's context is too small."""
    rl_train_before_balance: dict[str, int]
    rl_train: RLExampleStats
    rl_test: RLExampleStats
    rl_val_path: str = ""
    """Validation RL examples (natural action mix) from `data.val_fraction` of the training sessions; "" without."""
    num_rl_val: int = 0
    holdout: str = ""
    """data.holdout when the split is out of distribution (the held-out kinds are the validation and test sets)."""
    num_val_sessions: int = 0

    def render(self) -> str:
        lines = [self.train_sessions.render("train sessions"), self.test_sessions.render("test sessions"),
                 f"SFT conversations (train): {self.num_sft_train}"
                 + (f" ({self.num_sft_skipped} without a rationale left out: data.sft_missing_rationale=skip)"
                    if self.num_sft_skipped else ""),
                 f"RL train targets before balancing: {self.rl_train_before_balance}",
                 self.rl_train.render("RL examples (train)"),
                 self.rl_test.render("RL examples (test)"),
                 *([f"RL examples (validation, from {self.num_rl_val} of the training sessions' steps): "
                    f"{self.rl_val_path}"] if self.rl_val_path and not self.holdout else []),
                 *([f"out of distribution (data.holdout={self.holdout}): {self.test_sessions.num_sessions} test and "
                    f"{self.num_val_sessions} validation sessions of those kinds, none trained on; "
                    f"{self.num_rl_val} validation RL examples" + (f": {self.rl_val_path}" if self.rl_val_path else "")]
                   if self.holdout else []),
                 f"written to {self.out_dir}"]
        if not self.num_sft_train:
            lines.append("WARNING: 0 SFT conversations: no training step has a rationale (SFT needs one; RL does not): "
                         "raise data.rationale_fraction, set data.sft_missing_rationale=action_only, or fill them with "
                         "`shop-r1 data rationales`")
        if self.num_rl_over_budget:
            lines.append(f"left out {self.num_rl_over_budget} training RL examples whose current page alone exceeds "
                         "data.max_prompt_tokens")
        if self.num_rl_test_over_budget:
            lines.append(f"WARNING: left out {self.num_rl_test_over_budget} held-out RL examples whose current page "
                         "alone exceeds the test prompt budget: the held-out set is filtered by page length")
        if self.num_bad_lines:
            lines.insert(0, f"skipped {self.num_bad_lines} malformed session lines (data.skip_bad_lines=true)")
        return "\n".join(lines)


def build_datasets(sessions_path: str | Path, out_dir: str | Path, model_dir: str | Path, cfg: DataConfig,
                   seed: int = 0) -> BuiltDatasets:
    """Load + validate sessions, split, build and write `sft_train.jsonl`, `rl_train.jsonl`, `rl_test.jsonl`."""
    from shop_r1.models.tokenizer import load_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_sessions(sessions_path, skip_bad_lines=cfg.skip_bad_lines)
    if len(loaded.sessions) < 2:  # a split needs a session on each side
        raise DataError(f"{sessions_path}: {len(loaded.sessions)} usable session(s)"
                         + (f" ({loaded.num_bad_lines} bad lines skipped)" if loaded.num_bad_lines else "")
                         + ": building train and held-out examples needs at least 2")
    val_sessions: tuple = ()
    if cfg.holdout:  # out of distribution: whole kinds of shoppers or products never trained on
        field, values = parse_holdout(cfg.holdout)
        held = holdout_split(loaded.sessions, field, values, cfg.val_fraction, cfg.test_fraction, seed)
        split, val_sessions = SessionSplit(train=held.train, test=held.test), held.val
    else:
        split = split_sessions(loaded.sessions, cfg.test_fraction, seed)
        if cfg.val_fraction > 0:  # carved from the training sessions only: the test split stays as it was
            carved = split_sessions(split.train, cfg.val_fraction, seed + 1)
            split, val_sessions = dataclasses.replace(split, train=carved.train), carved.test
    if cfg.rationale_fraction < 1:  # as logs with few annotated sessions: training sessions only
        split = dataclasses.replace(split, train=drop_rationales(split.train, cfg.rationale_fraction, seed + 2))
    count_tokens = chat_token_counter(load_tokenizer(str(model_dir)))

    rl_train_build = build_rl_examples(split.train, cfg.context, cfg.max_prompt_tokens, count_tokens,
                                       cfg.history_rationales, cfg.persona, cfg.instructions, cfg.persona_position)
    test_budget = cfg.test_max_prompt_tokens or cfg.max_prompt_tokens
    rl_test_build = build_rl_examples(split.test, cfg.context, test_budget, count_tokens, cfg.history_rationales,
                                      cfg.persona, cfg.instructions, cfg.persona_position)
    rl_val = build_rl_examples(val_sessions, cfg.context, test_budget, count_tokens, cfg.history_rationales,
                               cfg.persona, cfg.instructions, cfg.persona_position).examples
    sft = build_sft_examples(split.train, cfg.persona, cfg.instructions, cfg.persona_position,
                             cfg.sft_missing_rationale) \
        if cfg.sft_format == "session" else build_step_sft_examples(rl_train_build.examples, cfg.sft_missing_rationale)
    sft_train = sft.examples
    rl_train = list(rl_train_build.examples)
    rl_unbalanced = type_counts(rl_train)
    if cfg.balance:
        rl_train = balance_rl_examples(rl_train, ratio=cfg.balance_ratio, seed=seed)
    rl_test = list(rl_test_build.examples)

    paths = {name: out / f"{name}.jsonl" for name in ("sft_train", "rl_train", "rl_test")}
    write_examples_jsonl(sft_train, paths["sft_train"])
    write_examples_jsonl(rl_train, paths["rl_train"])
    write_examples_jsonl(rl_test, paths["rl_test"])
    if val_sessions:
        paths["rl_val"] = out / "rl_val.jsonl"
        write_examples_jsonl(rl_val, paths["rl_val"])

    built = BuiltDatasets(
        out_dir=str(out), sft_train_path=str(paths["sft_train"]), rl_train_path=str(paths["rl_train"]),
        rl_test_path=str(paths["rl_test"]), num_bad_lines=loaded.num_bad_lines,
        train_sessions=session_stats(split.train), test_sessions=session_stats(split.test),
        num_sft_train=len(sft_train), num_sft_skipped=len(sft.skipped_session_ids),
        num_rl_over_budget=len(rl_train_build.over_budget_ids),
        num_rl_test_over_budget=len(rl_test_build.over_budget_ids),
        rl_train_before_balance=rl_unbalanced,
        rl_train=rl_example_stats(rl_train, [count_tokens(e.prompt) for e in rl_train]),
        rl_test=rl_example_stats(rl_test, [count_tokens(e.prompt) for e in rl_test]),
        rl_val_path=str(paths["rl_val"]) if val_sessions else "", num_rl_val=len(rl_val),
        holdout=cfg.holdout, num_val_sessions=len(val_sessions),
    )
    (out / "stats.json").write_text(json.dumps(asdict(built), indent=2))
    return built
