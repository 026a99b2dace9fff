"""Metric sinks: a console progress line, a JSONL file in the run folder, and wandb (offline by default).

Keys are `stage/name` (`reward/value`, `timing/rollout`); every record carries `step`. The JSONL file is the source of
truth (reports and tests read it, through `read_metrics`). Each record is one write of the whole line, newline
included, then a flush: a killed process loses at most the line it was writing, and the kernel keeps every line
whose write returned. A resumed run cuts such a torn last line before appending (`Tracker`), and logs the steps
after its checkpoint again: readers keep the last record of a step.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shop_r1.config import LoggingConfig

# The console line of a step shows these (when logged); every figure goes to the JSONL file and wandb.
CONSOLE_KEYS = ("sft/loss", "sft/grad_norm", "sft/lr", "reward/total", "reward/format", "reward/action_type",
                "reward/value", "reward/self_certainty", "rollout/type_terminate", "rollout/type_invalid",
                "train/loss", "train/kl", "train/grad_norm", "train/zero_signal_groups", "reward/num_failed",
                "rollout/engine_restarts", "train/skipped_update", "val/exact", "val/kappa", "val/pred_terminate")


class MetricsFileWarning(UserWarning):
    """A metrics JSONL line that is not a record: skipped by the readers, or (a torn last line) cut by the Tracker."""


class Tracker:
    def __init__(self, run_dir: str | Path, cfg: LoggingConfig, name: str, config: Mapping[str, Any] | None = None,
                 total_steps: int | None = None, first_step: int = 0, fsync: bool = False) -> None:
        """`fsync`: also fsync every line. Off by default: a killed process loses nothing once write() returned
        (the page cache is the kernel's), only a host crash does, and on network file systems (a shared run_dir)
        an fsync per step can cost more than the step's logging is worth. The steps after the last checkpoint are
        logged again on resume anyway."""
        self.path = Path(run_dir) / f"metrics_{name}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._cfg, self._name, self._fsync = cfg, name, fsync
        cut_torn_last_line(self.path)
        self._file = self.path.open("ab")
        self._start = time.perf_counter()
        self._total, self._first = total_steps, first_step  # ETA over the steps this process runs (after a resume)
        self._first_logged: tuple[int, float] | None = None
        self._wandb = None
        if cfg.wandb:
            import wandb

            group = cfg.run_name or Path(run_dir).resolve().name  # one group per pipeline, a run per stage
            self._wandb = wandb.init(project=cfg.wandb_project, entity=cfg.wandb_entity or None, group=group,
                                     job_type=name, name=f"{group}-{name}", dir=str(Path(run_dir)),
                                     config=dict(config or {}),
                                     mode=os.environ.get("WANDB_MODE", "offline"), reinit="finish_previous")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self._file.write((json.dumps(record) + "\n").encode())  # one write: a kill tears at most this line
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
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


def _record(line: bytes) -> dict:
    """The metrics record a line holds; ValueError (the reason) when it holds none."""
    try:
        value = json.loads(line)
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg}, column {e.colno}") from None
    if not isinstance(value, dict) or type(value.get("step")) is not int:
        raise ValueError("not an object with an integer 'step'")
    return value


def cut_torn_last_line(path: Path) -> None:
    """Make an existing metrics file end with a whole line before a resumed run appends to it.

    A last line that is not JSON (a write the run was killed in) is cut off, with a MetricsFileWarning naming
    FILE:LINE; the bytes before it are not touched. A last line that is JSON but lacks its newline (only the newline
    was lost, or a hand-written file) is kept and its newline added. Lines that end in a newline and parse are
    never removed; a bad line earlier in the file is left for the readers to skip.
    """
    if not path.is_file():
        return
    data = path.read_bytes()
    body = data[:-1] if data.endswith(b"\n") else data
    start = body.rfind(b"\n") + 1  # where the last line begins
    last, lineno = body[start:], body.count(b"\n") + 1
    if not last.strip():
        if data.endswith(b"\n") or not data:
            return
        reason = "blank"
    else:
        try:
            json.loads(last)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            reason = f"not JSON: {e}"
        else:
            if not data.endswith(b"\n"):
                with path.open("ab") as f:
                    f.write(b"\n")
            return
    os.truncate(path, start)
    warnings.warn(f"{path}:{lineno}: torn last line cut before appending ({len(last)} bytes, {reason}; the run was "
                  f"killed mid-write)", MetricsFileWarning, stacklevel=3)


@dataclass(frozen=True)
class MetricsRead:
    path: Path
    records: tuple[dict, ...]
    """One per step, the last one logged (a resumed run logs the steps after its checkpoint again), by step."""
    skipped: tuple[str, ...]
    """FILE:LINE of every non-blank line that is not a record (each one warned about)."""
    torn_last_line: bool
    """The last line lacks its newline and is not a record: a write cut by a kill (or one in progress)."""


def scan_metrics(path: str | Path) -> MetricsRead:
    """Read a tracker JSONL file. A line that is not a JSON object with an integer `step` is skipped with a
    MetricsFileWarning naming FILE:LINE; of a step logged more than once the last record is kept."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")  # the last element: b"" when the file ends with a newline
    by_step: dict[int, dict] = {}
    skipped: list[str] = []
    torn = False
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = _record(line)
        except ValueError as e:
            skipped.append(f"{path}:{lineno}")
            if lineno == len(lines):  # no newline after it: cut by a kill, or being written now
                torn = True
            what = "torn last line" if torn else "line"
            warnings.warn(f"{path}:{lineno}: {what} skipped ({e})", MetricsFileWarning, stacklevel=2)
            continue
        by_step[record["step"]] = record
    return MetricsRead(path, tuple(by_step[s] for s in sorted(by_step)), tuple(skipped), torn)


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a tracker JSONL file, one per step (the last logged), by step; see `scan_metrics`."""
    return list(scan_metrics(path).records)
