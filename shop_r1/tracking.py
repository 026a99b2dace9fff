"""Metric sinks: a console progress line, a JSONL file in the run folder, and wandb (offline by default).

Keys are `stage/name` (`reward/value`, `timing/rollout`); every record carries `step`. The JSONL file is the source of
truth (reports and tests read it); it is appended line by line and flushed, so a killed run keeps what it logged.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

from shop_r1.config import LoggingConfig


class Tracker:
    def __init__(self, run_dir: str | Path, cfg: LoggingConfig, name: str, config: Mapping[str, Any] | None = None
                 ) -> None:
        self.path = Path(run_dir) / f"metrics_{name}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._cfg, self._name = cfg, name
        self._file = self.path.open("a", encoding="utf-8")
        self._start = time.perf_counter()
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
            shown = "  ".join(f"{k}={_fmt(v)}" for k, v in metrics.items() if not k.startswith("timing/"))
            print(f"[{self._name} {step:>5d} {time.perf_counter() - self._start:7.1f}s] {shown}", flush=True)

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def _fmt(v: float) -> str:
    v = float(v)
    if v == 0 or math.isnan(v) or 1e-3 <= abs(v) < 1e5:
        return f"{v:.4g}"
    return f"{v:.3e}"
