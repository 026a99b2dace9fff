"""Resumable GRPO checkpoints, written atomically.

    <run>/checkpoints/step_000010/   DeepSpeed state (weights + optimizer) and state.json (step, data cursor, RNG,
                                     resolved config); with rl.async_level=1 also pending_rollout.pkl (the rollout
                                     already made for the next step)
    <run>/checkpoints/latest         the name of the newest complete checkpoint

A checkpoint is written into `step_N.tmp` and renamed when complete; `latest` is replaced (atomically) only after
that, so a kill mid-save leaves the previous checkpoint and pointer intact. `prune`, run after `save`, bounds the
disk use: it keeps the newest few complete checkpoints and the one `latest` names.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class TrainState:
    step: int
    cursor_epoch: int
    cursor_position: int
    rng: dict[str, Any]


def capture_rng() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state().tolist()}


def restore_rng(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (tuple, list)):
        return [_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


class CheckpointError(OSError):
    """A checkpoint could not be written (a full disk, a lost mount); the previous complete one is untouched."""


def save(root: str | Path, state: TrainState, config: dict[str, Any], save_learner: Callable[[str], None],
         extra: dict[str, bytes] | None = None) -> Path:
    """`extra`: more files of the driver's state (e.g. the rollout already made for the next step), by name."""
    root = Path(root)
    final = root / f"step_{state.step:06d}"
    tmp = root / f"step_{state.step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_learner(str(tmp / "deepspeed"))
        for name, data in (extra or {}).items():
            (tmp / name).write_bytes(data)
        (tmp / "state.json").write_text(json.dumps(_jsonable({**state.__dict__, "config": config})))
    except OSError as e:  # the partial copy is removed (it may be what filled the disk); `latest` is not touched
        shutil.rmtree(tmp, ignore_errors=True)
        before = root / "latest"
        kept = before.read_text().strip() if before.is_file() else "none yet"
        raise CheckpointError(e.errno, f"checkpoint {final} not written ({e.strerror or e}); the last complete "
                                       f"checkpoint ({kept}) is intact and `--resume` continues from it") from e
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer_tmp = root / "latest.tmp"
    pointer_tmp.write_text(final.name)
    os.replace(pointer_tmp, root / "latest")
    return final


def latest(root: str | Path) -> Path | None:
    pointer = Path(root) / "latest"
    if not pointer.is_file():
        return None
    path = Path(root) / pointer.read_text().strip()
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"{pointer} names {path.name}, which has no state.json: the checkpoint is damaged")
    return path


def load_state(path: str | Path) -> TrainState:
    raw = json.loads((Path(path) / "state.json").read_text())
    return TrainState(raw["step"], raw["cursor_epoch"], raw["cursor_position"], raw["rng"])


def read_extra(path: str | Path, name: str) -> bytes | None:
    """A file `save` wrote through `extra`, or None when that checkpoint has none."""
    file = Path(path) / name
    return file.read_bytes() if file.is_file() else None


_COMPLETE = re.compile(r"step_(\d+)")  # step_N.tmp (being written) and step_N.deleting do not match


def prune(root: str | Path, keep: int) -> list[Path]:
    """Remove all but the `keep` newest complete checkpoints (by step) under `root`; returns the removed ones' paths
    (`step_N`, also for a `step_N.deleting` leftover).

    Run it after `save` returned, i.e. once the newer checkpoint is complete and `latest` names it. It never
    removes the checkpoint `latest` names (even when that is not among the newest, e.g. after a kill between the
    rename and the pointer update), nor a `step_N.tmp` being written. Without a `latest` pointer nothing is
    removed. A checkpoint is renamed to `step_N.deleting` before it is deleted, so a kill mid-prune never leaves
    a half-deleted `step_N` that looks complete; the next prune finishes such leftovers.
    """
    if keep < 1:
        raise ValueError(f"keep={keep}: at least the newest checkpoint must be kept (rl.keep_checkpoints >= 1)")
    root = Path(root)
    current = latest(root)
    if current is None:
        return []
    complete = sorted((int(m.group(1)), p) for p in root.iterdir()
                      if p.is_dir() and (m := _COMPLETE.fullmatch(p.name)) and (p / "state.json").is_file())
    leftovers = sorted(p for p in root.iterdir() if p.is_dir() and p.suffix == ".deleting")
    for path in leftovers:  # first, so that a rename below never meets a leftover of the same name
        shutil.rmtree(path)
    removed = [path for _, path in complete[:-keep] if path.name != current.name]
    for path in removed:
        shutil.rmtree(path.rename(path.with_name(path.name + ".deleting")))
    return [p.with_name(p.name.removesuffix(".deleting")) for p in leftovers] + removed
