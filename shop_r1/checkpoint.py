"""Resumable GRPO checkpoints, written durably and atomically, one timeline at a time.

    <run>/checkpoints/step_000010/   deepspeed/ (LEARNER_DIR: the learner's weights + optimizer, either backend's)
                                     and state.json (step, data cursor, RNG, resolved config); with
                                     rl.async_level=1 also pending_rollout.json (the rollout already made for the
                                     next step)
    <run>/checkpoints/latest         the name of the newest complete checkpoint
    <run>/checkpoints/abandoned/001_resumed_from_step_000010/
                                     checkpoints past the step a run resumed from (moved there, never deleted)

A checkpoint is written into `step_N.tmp`; every file and folder in it is fsynced, it is renamed to `step_N` and
the rename is fsynced (the parent folder). Only then is `latest` replaced, the same way (a temp file, fsync, rename,
fsync; shop_r1/atomic.py holds both recipes). So neither a kill nor a power cut mid-save can publish a name whose
data is not on disk: the previous checkpoint and pointer stay intact. Any exception while writing is a failed save
(the `.tmp` copy is removed).

Timelines: a run resumed from step K leaves the checkpoints past K (of the run it continues) on another timeline.
`abandon_later_checkpoints` moves them under `abandoned/`, so that `prune`'s `keep` counts the new timeline's and a
resume that lost `latest` cannot pick them. `prune`, run after `save`, bounds the disk use.
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

from shop_r1.atomic import fsync_path, publish_atomically, write_atomic

LEARNER_DIR = "deepspeed"
"""The checkpoint's subfolder of learner state (weights, optimizer), whichever `learner.backend` wrote it (FSDP2's
too). Named when DeepSpeed was the only backend and kept: runs on disk resume from `step_N/deepspeed`, and a rename
would leave them unresumable."""


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
    """A checkpoint could not be written (a full disk, a lost mount, a failing writer); the previous complete one
    is untouched."""


def save(root: str | Path, state: TrainState, config: dict[str, Any], save_learner: Callable[[str], None],
         extra: dict[str, bytes] | None = None) -> Path:
    """Write `root/step_N` (N = state.step) and point `latest` at it; returns the folder.

    `save_learner(folder)` writes the learner's state (its backend's save_checkpoint) into `folder`, which it creates.
    `extra`: more files of the driver's state (e.g. the rollout already made for the next step), by name.
    Any exception while writing or publishing is a failed save (an OSError from a full disk; torch.save's zip writer
    raises a RuntimeError that carries no errno instead): the `.tmp` copy is removed (it may be what filled the disk),
    `latest` is not touched, and a CheckpointError naming the folder is raised from the original error.
    """
    root = Path(root)
    final = root / f"step_{state.step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    previous = _in_force(root)
    try:
        _make_dir(root)
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a killed save of this step
        tmp.mkdir()
        save_learner(str(tmp / LEARNER_DIR))
        for name, data in (extra or {}).items():
            (tmp / name).write_bytes(data)
        (tmp / "state.json").write_text(json.dumps(_jsonable({**state.__dict__, "config": config})))
        publish_atomically(tmp, final)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _failed(f"checkpoint {final} not written", e, f"the last complete checkpoint ({previous}) is intact "
                                                            "and `--resume` continues from it") from e
    try:
        _write_pointer(root, final.name)
    except Exception as e:
        raise _failed(f"checkpoint {final} is complete but `latest` was not updated", e,
                      f"`latest` still names {previous}, from which `--resume` continues") from e
    return final


def latest(root: str | Path) -> Path | None:
    """The checkpoint to resume from: the one `latest` names or, when that file is missing (a kill between the
    first checkpoint's rename and its pointer, a pointer lost by hand), the newest complete `step_N` directly under
    `root` (never one in `abandoned/`, nor an unpublished `step_N.tmp`). None when there is none: a fresh run."""
    name = _pointer(root)
    if name is None:
        return newest_complete(root)
    path = Path(root) / name
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"{Path(root) / 'latest'} names {path.name}, which has no state.json: the checkpoint "
                                "is damaged")
    return path


def newest_complete(root: str | Path) -> Path | None:
    """The complete `step_N` (with its state.json) of the highest N directly under `root`, or None."""
    found = _complete(Path(root))
    return found[-1] if found else None


def load_state(path: str | Path) -> TrainState:
    raw = json.loads((Path(path) / "state.json").read_text())
    return TrainState(raw["step"], raw["cursor_epoch"], raw["cursor_position"], raw["rng"])


def read_extra(path: str | Path, name: str) -> bytes | None:
    """A file `save` wrote through `extra`, or None when that checkpoint has none."""
    file = Path(path) / name
    return file.read_bytes() if file.is_file() else None


def abandon_later_checkpoints(root: str | Path, resumed_step: int) -> list[Path]:
    """Move every checkpoint folder past `resumed_step` (`step_N` and unpublished `step_N.tmp`, N > resumed_step) into
    a new `root/abandoned/NNN_resumed_from_step_K/` (K = resumed_step); returns their new paths, lowest step first
    ([] and no new folder when there are none). Call it on resume, after choosing the checkpoint to resume from.

    Those folders are the timeline the run left: a resume from an older checkpoint, or a save killed before `latest`
    named it. Left in place they would outrank the new timeline's checkpoints in `prune` and in `latest`'s fallback.
    They are moved, never deleted (the person running it decides). A `latest` naming one of them moves with them,
    and `latest` is written anew to name `step_K` when that is complete (K = 0, a fresh start, names none).
    """
    root = Path(root)
    if not root.is_dir():
        return []
    later = sorted((p for p in root.iterdir() if p.is_dir() and (m := _STEP_OR_TMP.fullmatch(p.name))
                    and int(m.group(1)) > resumed_step), key=_step_of)
    pointer, moved = _pointer(root), []
    if later:
        dest = _new_abandoned_folder(root, resumed_step)
        for path in later:
            moved.append(path.rename(dest / path.name))
        if pointer in {p.name for p in later}:
            os.replace(root / "latest", dest / "latest")
            pointer = None
        for folder in (dest, dest.parent, root):  # the moves (renames) made durable
            fsync_path(folder)
    resumed = root / f"step_{resumed_step:06d}"
    if (resumed / "state.json").is_file() and pointer != resumed.name:
        _write_pointer(root, resumed.name)
    return moved


_COMPLETE = re.compile(r"step_(\d+)")  # step_N.tmp (being written) and step_N.deleting do not match
_STEP_OR_TMP = re.compile(r"step_(\d+)(?:\.tmp)?")


def prune(root: str | Path, keep: int) -> list[Path]:
    """Remove all but the `keep` newest complete checkpoints of the current timeline under `root`; returns the
    removed ones' paths (`step_N`, also for a `step_N.deleting` leftover).

    The current timeline is the checkpoints up to the step `latest` names. Run prune after `save` returned, i.e.
    once the newer checkpoint is complete and `latest` names it: a checkpoint past that step is never counted nor
    removed (another timeline, or a save killed before its pointer update: `abandon_later_checkpoints` moves those
    aside on resume), so it cannot push the run's own checkpoints out. Prune never removes the checkpoint `latest`
    names, e.g. the one a run resumed from while no newer one is complete, nor a `step_N.tmp` being written.
    Without a `latest` pointer nothing is removed. A checkpoint is renamed to `step_N.deleting` before it is
    deleted, so a kill mid-prune never leaves a half-deleted `step_N` that looks complete; the next prune finishes
    such leftovers.
    """
    if keep < 1:
        raise ValueError(f"keep={keep}: at least the newest checkpoint must be kept (rl.keep_checkpoints >= 1)")
    root = Path(root)
    if _pointer(root) is None:
        return []
    current = latest(root)
    timeline = [p for p in _complete(root) if _step_of(p) <= _step_of(current)]
    leftovers = sorted(p for p in root.iterdir() if p.is_dir() and p.suffix == ".deleting")
    for path in leftovers:  # first, so that a rename below never meets a leftover of the same name
        shutil.rmtree(path)
    removed = [path for path in timeline[:-keep] if path.name != current.name]
    for path in removed:
        shutil.rmtree(path.rename(path.with_name(path.name + ".deleting")))
    return [p.with_name(p.name.removesuffix(".deleting")) for p in leftovers] + removed


def _make_dir(path: Path) -> None:
    if not path.is_dir():
        path.mkdir(parents=True)
        fsync_path(path.parent)


def _write_pointer(root: Path, name: str) -> None:
    write_atomic(root / "latest", name)


def _pointer(root: str | Path) -> str | None:
    pointer = Path(root) / "latest"
    return pointer.read_text().strip() if pointer.is_file() else None


def _step_of(path: Path) -> int:
    if (m := _STEP_OR_TMP.fullmatch(path.name)) is None:
        raise ValueError(f"{path.name} is not a checkpoint folder name (step_N)")
    return int(m.group(1))


def _in_force(root: Path) -> str:
    """The name of the checkpoint a resume would use now, for messages (a damaged pointer is still named)."""
    newest = newest_complete(root)
    return _pointer(root) or (newest.name if newest is not None else "none yet")


def _complete(root: Path) -> list[Path]:
    """The complete `step_N` folders directly under `root` (each with its state.json), by step number."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and _COMPLETE.fullmatch(p.name)
                   and (p / "state.json").is_file()), key=_step_of)


def _new_abandoned_folder(root: Path, resumed_step: int) -> Path:
    """`root/abandoned/NNN_resumed_from_step_K`, NNN one past the highest so far (a counter: clocks can go back)."""
    base = root / "abandoned"
    _make_dir(base)
    used = [int(m.group(1)) for p in base.iterdir() if (m := re.match(r"(\d+)_", p.name))]
    dest = base / f"{max(used, default=0) + 1:03d}_resumed_from_step_{resumed_step:06d}"
    dest.mkdir()
    return dest


def _failed(what: str, error: Exception, after: str) -> CheckpointError:
    """A CheckpointError `<what> (<cause>); <after>`, with the errno of the first OSError in the cause chain."""
    cause = (error.strerror or str(error)) if isinstance(error, OSError) else \
        f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
    chain, found = error, None
    while chain is not None and found is None:
        found = chain.errno if isinstance(chain, OSError) else None
        chain = chain.__cause__ or chain.__context__
    message = f"{what} ({cause}); {after}"
    return CheckpointError(found, message) if found is not None else CheckpointError(message)
