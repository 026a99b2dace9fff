"""`shop-r1 sft`: the SFT cold start (paper Eq. 2) on whole-session conversations, loss on assistant turns only.

    conversations -> tokenize (chat template, assistant mask) -> per step: global batch -> per-rank token-budget
    micro-batches -> learner group step -> log -> (end) HF folder + DeepSpeed checkpoint

Writes `out_dir/hf` (weights, tokenizer, chat template: vLLM loads it) and `out_dir/checkpoint` (the final DeepSpeed
state with optimizer), plus `metrics_sft.jsonl` in `cfg.run_dir`. Every `sft.checkpoint_every` steps a resumable
checkpoint lands in `out_dir/checkpoints/step_N` (atomic, as GRPO's): the step is the data position (epoch, batch),
since each epoch's batches are a pure function of (seed, epoch).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shop_r1 import checkpoint
from shop_r1.algo import finite
from shop_r1.config import Config, config_to_dict
from shop_r1.distributed.learner_group import LearnerGroup
from shop_r1.storage import mirror_or_warn
from shop_r1.tracking import Tracker


@dataclass(frozen=True)
class SFTResult:
    hf_dir: str
    checkpoint_dir: str
    num_steps: int
    first_loss: float
    last_loss: float
    num_dropped_conversations: int
    seconds: float


def run_sft(cfg: Config, model_path: str, sft_examples_path: str | Path, out_dir: str | Path, local: bool,
            resume: bool = False, learner_cls: type | None = None) -> SFTResult:
    """Needs Ray started (or `local`). `resume`: continue from the newest checkpoint in `out_dir/checkpoints` (a
    fresh run when there is none), with the same next batch and the same weights as an uninterrupted run.

    A learner rank that dies ends the attempt; its actors are torn down and SFT resumes from the last checkpoint in
    the same process, up to `sft.max_restarts` times (steps after that checkpoint run again and are logged again;
    readers keep the last record of a step). `learner_cls` replaces the learner rank actor (fault tests).
    """
    from shop_r1.data.examples import load_sft_examples
    from shop_r1.distributed.actors import with_restarts
    from shop_r1.learner.sft_data import tokenize_sft_examples
    from shop_r1.models.tokenizer import load_tokenizer

    start = time.perf_counter()
    tokenizer = load_tokenizer(model_path)
    tokenized = tokenize_sft_examples(load_sft_examples(sft_examples_path), tokenizer, cfg.sft.max_seq_len)
    if not tokenized.sequences:
        raise ValueError(f"{sft_examples_path}: no SFT conversation fits sft.max_seq_len={cfg.sft.max_seq_len}")
    step, losses = with_restarts(lambda again: _run_sft_attempt(
        cfg, model_path, tokenized, tokenizer.pad_token_id or 0, Path(out_dir), local, resume or again, learner_cls),
        cfg.sft.max_restarts, local, "sft")
    out = Path(out_dir)
    return SFTResult(str(out / "hf"), str(out / "checkpoint"), step, losses[0] if losses else math.nan,
                     losses[-1] if losses else math.nan, tokenized.num_dropped, time.perf_counter() - start)


def schedule(num_sequences: int, cfg: Config) -> tuple[int, int, int]:
    """(total optimizer steps, steps per epoch, epochs): `sft.max_steps` if set, else `sft.epochs` passes."""
    steps_per_epoch = math.ceil(num_sequences / cfg.sft.global_batch_size)
    total_steps = cfg.sft.max_steps or cfg.sft.epochs * steps_per_epoch
    return total_steps, steps_per_epoch, math.ceil(total_steps / steps_per_epoch)  # the last epoch may be cut short


def _run_sft_attempt(cfg: Config, model_path: str, tokenized: Any, pad: int, out: Path, local: bool, resume: bool,
                     learner_cls: type | None) -> tuple[int, list[float]]:
    from shop_r1.learner.sft_data import pack_micro_batches, sft_global_batches

    sequences = tokenized.sequences
    total_steps, steps_per_epoch, num_epochs = schedule(len(sequences), cfg)
    print(f"SFT: {len(sequences)} conversations ({tokenized.num_dropped} dropped as too long), "
          f"{total_steps} steps ({num_epochs} epoch(s) of {steps_per_epoch}), {cfg.learner.num_ranks} rank(s)",
          flush=True)
    print(f"  starting {cfg.learner.num_ranks} learner rank(s) ({cfg.learner.backend})", flush=True)
    group = LearnerGroup(model_path, cfg.learner, cfg.sft.lr, total_steps, cfg.seed, local=local,
                         warmup_steps=round(cfg.sft.warmup_ratio * total_steps), lr_schedule=cfg.sft.lr_schedule,
                         learner_cls=learner_cls)
    ckpt_root = out / "checkpoints"
    step = _resume(ckpt_root, group) if resume else _fresh(ckpt_root)
    tracker = Tracker(cfg.run_dir, cfg.logging, "sft", config_to_dict(cfg), total_steps=total_steps,
                      first_step=step)
    streak = finite.NonFiniteStreak(cfg.sft.max_nonfinite_steps, where="SFT")
    losses: list[float] = []
    epoch_batches: tuple[int, list] = (-1, [])
    try:
        while step < total_steps:
            epoch, position = divmod(step, steps_per_epoch)
            if epoch_batches[0] != epoch:
                epoch_batches = (epoch, sft_global_batches(sequences, cfg.sft.global_batch_size,
                                                           cfg.learner.num_ranks, epoch, cfg.seed))
            batch = epoch_batches[1][position]
            per_rank = [pack_micro_batches(share, cfg.learner.max_tokens_per_micro_batch, pad) for share in batch]
            num_tokens = sum(mb.num_loss_tokens for share in per_rank for mb in share)
            t0 = time.perf_counter()
            stats = group.sft_step(per_rank, num_tokens)
            step += 1
            cause = stats[0].nonfinite
            loss = sum(s.loss for s in stats)  # each rank reports its share of the global token mean
            if not cause:
                losses.append(loss)
            tracker.log(step, {"sft/loss": loss, "sft/grad_norm": stats[0].grad_norm, "sft/lr": stats[0].lr,
                               "sft/epoch": epoch, "sft/loss_tokens": num_tokens,
                               "sft/skipped_update": float(bool(cause)),
                               **{f"sft/nonfinite_{c}": float(cause == c) for c in ("loss", "grad_norm")},
                               "timing/update": time.perf_counter() - t0})
            streak.observe(step, cause)
            if step % cfg.sft.checkpoint_every == 0 and step < total_steps:
                _checkpoint(cfg, ckpt_root, group, step, steps_per_epoch)
        group.save_hf(str(out / "hf"))
        group.save_checkpoint(str(out / "checkpoint"), {"step": step, "epoch": num_epochs})
    finally:
        tracker.close()
        group.shutdown()
    return step, losses


def _resume(ckpt_root: Path, group: LearnerGroup) -> int:
    found = checkpoint.latest(ckpt_root)
    if found is None:
        return 0
    state = checkpoint.load_state(found)
    group.load_checkpoint(str(found / checkpoint.LEARNER_DIR))
    checkpoint.restore_rng(state.rng)
    moved = checkpoint.abandon_later_checkpoints(ckpt_root, state.step)
    print(f"SFT resumed from {found} (step {state.step})" +
          (f"; later checkpoints of the abandoned timeline moved to {moved[0].parent}" if moved else ""), flush=True)
    return state.step


def _fresh(ckpt_root: Path) -> int:
    """A run started afresh in a folder with checkpoints: they are moved aside (never deleted), not mixed in."""
    moved = checkpoint.abandon_later_checkpoints(ckpt_root, 0)
    if moved:
        print(f"SFT starts afresh: {len(moved)} earlier checkpoint(s) moved to {moved[0].parent}", flush=True)
    return 0


def _checkpoint(cfg: Config, ckpt_root: Path, group: LearnerGroup, step: int, steps_per_epoch: int) -> None:
    # Never publish NaN/inf weights: the previous checkpoint stays the latest.
    finite.check_weights_finite(group.nonfinite_weights(), f"SFT step {step}", checkpoint.latest(ckpt_root))
    epoch, position = divmod(step, steps_per_epoch)
    state = checkpoint.TrainState(step, epoch, position, checkpoint.capture_rng())
    checkpoint.save(ckpt_root, state, config_to_dict(cfg), lambda d: group.save_checkpoint(d, {"step": step}))
    checkpoint.prune(ckpt_root, cfg.sft.keep_checkpoints)
    mirror_or_warn(cfg.run_dir, cfg.storage_uri)
