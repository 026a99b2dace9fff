"""logging: the console's progress lines and wandb."""

from __future__ import annotations

from dataclasses import dataclass

from shop_r1.config.fields import bounded


@dataclass
class LoggingConfig:
    wandb: bool = True
    """Log to wandb too (offline files in the run folder unless WANDB_MODE=online)."""
    wandb_project: str = "shop-r1"
    """The wandb project."""
    wandb_entity: str = ""
    """The wandb entity (team or user); empty: your default entity."""
    run_name: str = ""
    """The wandb run group of this run folder (every stage of one pipeline is one run in it, its job type the
    stage: sft, grpo); empty: the run folder's name. The runs are named GROUP-STAGE."""
    console_every: int = bounded(1, ge=0)
    """Print a progress line every this many steps (0: never)."""

