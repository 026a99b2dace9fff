"""`shop-r1 sft`: the SFT cold start (paper Eq. 2) on whole-session conversations, loss on assistant turns only.

    conversations -> tokenize (chat template, assistant mask) -> per step: global batch -> per-rank token-budget
    micro-batches -> learner group step -> log -> (end) HF folder + DeepSpeed checkpoint

Writes `out_dir/hf` (weights, tokenizer, chat template: vLLM loads it) and `out_dir/checkpoint` (DeepSpeed state with
optimizer, to resume), plus `metrics_sft.jsonl` in `cfg.run_dir`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from shop_r1.config import Config, config_to_dict
from shop_r1.distributed.learner_group import LearnerGroup
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


def run_sft(cfg: Config, model_path: str, sft_examples_path: str | Path, out_dir: str | Path, local: bool
            ) -> SFTResult:
    """Needs Ray started (or `local`)."""
    from transformers import AutoTokenizer

    from shop_r1.data.examples import load_sft_examples
    from shop_r1.learner.sft_data import pack_micro_batches, sft_global_batches, tokenize_sft_examples

    start = time.perf_counter()
    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenized = tokenize_sft_examples(load_sft_examples(sft_examples_path), tokenizer, cfg.sft.max_seq_len)
    sequences = tokenized.sequences
    if not sequences:
        raise ValueError(f"{sft_examples_path}: no SFT conversation fits sft.max_seq_len={cfg.sft.max_seq_len}")
    steps_per_epoch = math.ceil(len(sequences) / cfg.sft.global_batch_size)
    total_steps = cfg.sft.max_steps or cfg.sft.epochs * steps_per_epoch
    num_epochs = math.ceil(total_steps / steps_per_epoch)  # the last one cut short when sft.max_steps says so
    print(f"SFT: {len(sequences)} conversations ({tokenized.num_dropped} dropped as too long), "
          f"{total_steps} steps ({num_epochs} epoch(s) of {steps_per_epoch}), {cfg.learner.num_ranks} rank(s)",
          flush=True)

    print(f"  starting {cfg.learner.num_ranks} DeepSpeed learner rank(s) (the first run on a machine builds "
          "DeepSpeed's CPU communication op: about a minute)", flush=True)
    group = LearnerGroup(model_path, cfg.learner, cfg.sft.lr, total_steps, cfg.seed, local=local,
                         warmup_steps=round(cfg.sft.warmup_ratio * total_steps), lr_schedule=cfg.sft.lr_schedule)
    tracker = Tracker(cfg.run_dir, cfg.logging, "sft", config_to_dict(cfg), total_steps=total_steps)
    losses: list[float] = []
    step = 0
    try:
        for epoch in range(num_epochs):
            for batch in sft_global_batches(sequences, cfg.sft.global_batch_size, cfg.learner.num_ranks, epoch,
                                            cfg.seed)[:total_steps - step]:
                budget, pad = cfg.learner.max_tokens_per_micro_batch, tokenizer.pad_token_id or 0
                per_rank = [pack_micro_batches(share, budget, pad) for share in batch]
                num_tokens = sum(mb.num_loss_tokens for share in per_rank for mb in share)
                t0 = time.perf_counter()
                stats = group.sft_step(per_rank, num_tokens)
                step += 1
                loss = sum(s.loss for s in stats)  # each rank reports its share of the global token mean
                losses.append(loss)
                tracker.log(step, {"sft/loss": loss, "sft/grad_norm": stats[0].grad_norm, "sft/lr": stats[0].lr,
                                   "sft/epoch": epoch, "sft/loss_tokens": num_tokens,
                                   "timing/update": time.perf_counter() - t0})
        group.save_hf(str(out / "hf"))
        group.save_checkpoint(str(out / "checkpoint"), {"step": step, "epoch": num_epochs})
    finally:
        tracker.close()
        group.shutdown()
    return SFTResult(str(out / "hf"), str(out / "checkpoint"), step, losses[0], losses[-1], tokenized.num_dropped,
                     time.perf_counter() - start)
