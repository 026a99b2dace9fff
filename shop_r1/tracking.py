"""Metric sinks: a console progress line, a JSONL file in the run folder, and wandb (offline by default).

Keys are `stage/name` (`reward/value`, `timing/rollout`); every record carries `step`. The JSONL file is the source of
truth (reports and tests read it); it is appended line by line and flushed, so a killed run keeps what it logged.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shop_r1.config import LoggingConfig

# The console line of a step shows these (when logged); every figure goes to the JSONL file and wandb.
CONSOLE_KEYS = ("sft/loss", "sft/grad_norm", "sft/lr", "reward/total", "reward/format", "reward/action_type",
                "reward/value", "reward/self_certainty", "rollout/type_terminate", "rollout/type_invalid",
                "train/loss", "train/kl", "train/grad_norm", "train/zero_signal_groups", "reward/num_failed",
                "rollout/engine_restarts", "train/skipped_update", "val/exact", "val/kappa", "val/pred_terminate")


class Tracker:
    def __init__(self, run_dir: str | Path, cfg: LoggingConfig, name: str, config: Mapping[str, Any] | None = None,
                 total_steps: int | None = None, first_step: int = 0) -> None:
        self.path = Path(run_dir) / f"metrics_{name}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._cfg, self._name = cfg, name
        self._file = self.path.open("a", encoding="utf-8")
        self._start = time.perf_counter()
        self._total, self._first = total_steps, first_step  # ETA over the steps this process runs (after a resume)
        self._first_logged: tuple[int, float] | None = None
        self._wandb = None
        if cfg.wandb:
            import wandb

            self._wandb = wandb.init(project=cfg.wandb_project, name=f"{Path(run_dir).name}-{name}",
                                     dir=str(Path(run_dir)), config=dict(config or {}),
                                     mode=os.environ.get("WANDB_MODE", "offline"), reinit="finish_previous")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)
        if self._cfg.console_every and step % self._cfg.console_every == 0:
            shown = "  ".join(f"{k}={_fmt(metrics[k])}" for k in CONSOLE_KEYS if k in metrics)
            elapsed = time.perf_counter() - self._start
            if self._total:
                # The rate from the first logged step on (the start-up before it is not a step's cost).
                if self._first_logged is None:
                    self._first_logged = (step, elapsed)
                    rate = elapsed / max(step - self._first, 1)
                else:
                    first_step, first_time = self._first_logged
                    rate = (elapsed - first_time) / max(step - first_step, 1)
                eta = rate * max(self._total - step, 0)
                where = f"{step:>4d}/{self._total} {elapsed:6.0f}s ETA {int(eta // 60)}m{int(eta % 60):02d}s"
            else:
                where = f"{step:>5d} {elapsed:7.1f}s"
            print(f"[{self._name} {where}] {shown}", flush=True)

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def _fmt(v: float) -> str:
    v = float(v)
    if v == 0 or math.isnan(v) or 1e-3 <= abs(v) < 1e5:
        return f"{v:.4g}"
    return f"{v:.3e}"
