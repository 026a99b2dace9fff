"""Resumable GRPO checkpoints, written atomically.

    <run>/checkpoints/step_000010/   DeepSpeed state (weights + optimizer) and state.json (step, data cursor, RNG,
                                     resolved config)
    <run>/checkpoints/latest         the name of the newest complete checkpoint

A checkpoint is written into `step_N.tmp` and renamed when complete; `latest` is replaced (atomically) only after
that, so a kill mid-save leaves the previous checkpoint and pointer intact.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

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


def save(root: str | Path, state: TrainState, config: dict[str, Any], save_learner: Callable[[str], None]) -> Path:
    root = Path(root)
    final = root / f"step_{state.step:06d}"
    tmp = root / f"step_{state.step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_learner(str(tmp / "deepspeed"))
    (tmp / "state.json").write_text(json.dumps(_jsonable({**state.__dict__, "config": config})))
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
