"""sft: the SFT cold start (section 4.1), its schedule, checkpoints and restarts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shop_r1.config.fields import bounded


@dataclass
class SFTConfig:
    epochs: int = bounded(4, ge=1)
    """Passes over the SFT data."""
    lr: float = bounded(2e-5, gt=0)
    """Peak learning rate."""
    global_batch_size: int = bounded(64, ge=1)
    """Conversations per optimizer step (split across ranks and micro-batches)."""
    max_seq_len: int = bounded(32768, ge=1)
    """Token budget of one SFT conversation; longer ones lose their oldest turns (see learner/sft_data.py)."""
    warmup_ratio: float = bounded(0.0, ge=0, lt=1)
    """Share of the optimizer steps spent warming the learning rate up from 0."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After warmup: `constant` (the paper states no decay) or `cosine` down to 10% of `lr` on the last step."""
    max_steps: int = bounded(0, ge=0)
    """If > 0, run exactly this many optimizer steps instead of `epochs` passes (the data is passed over as many times
    as needed, reshuffled each pass, as HF Trainer's max_steps; warmup_ratio applies to these steps). 0: `epochs`
    passes. The experiments' "SFT continued" row uses it to match the RL stage's wall time."""
    checkpoint_every: int = bounded(20, ge=1)
    """Save a resumable checkpoint (weights, optimizer, schedule, data position) every this many steps, atomically
    as GRPO does (shop_r1/checkpoint.py); a rerun of `shop-r1 pipeline` or `shop-r1 sft --resume` continues from the
    newest."""
    keep_checkpoints: int = bounded(2, ge=1)
    """Keep the newest this many complete SFT checkpoints."""
    max_restarts: int = bounded(2, ge=0)
    """A learner rank that dies ends the attempt; the actors are torn down and SFT resumes from its last checkpoint in
    the same process, at most this many times."""
    max_nonfinite_steps: int = bounded(3, ge=1)
    """A step whose loss or gradient norm is NaN/inf skips its optimizer step (counted in sft/nonfinite_*); this many
    in a row stop SFT with an error, its checkpoints holding finite weights only."""

