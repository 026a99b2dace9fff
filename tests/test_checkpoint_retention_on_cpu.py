"""Checkpoint retention: `prune` after every `save` keeps disk use bounded and `latest` always loadable."""

from pathlib import Path

import pytest

from shop_r1 import checkpoint
from shop_r1.checkpoint import TrainState

PAYLOAD_BYTES = 10_000  # stands in for the DeepSpeed shards


def _save(root: Path, step: int) -> Path:
    def fake_learner(directory: str) -> None:
        Path(directory).mkdir(parents=True)
        (Path(directory) / "model.bin").write_bytes(bytes([step % 256]) * PAYLOAD_BYTES)

    return checkpoint.save(root, TrainState(step, 0, step, {"python": None}), {"rl": {"steps": 100}}, fake_learner)


def _step_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_disk_use_stays_bounded_and_latest_stays_loadable(tmp_path, keep):
    root = tmp_path / "checkpoints"
    one = None
    for step in range(5, 105, 5):  # 20 saves, as with rl.checkpoint_every=5
        _save(root, step)
        removed = checkpoint.prune(root, keep)
        one = one or _disk_bytes(root)  # a single checkpoint (state.json + payload) and the pointer
        found = checkpoint.latest(root)
        assert found is not None and found.name == f"step_{step:06d}"
        assert checkpoint.load_state(found).step == step
        assert (found / "deepspeed" / "model.bin").read_bytes() == bytes([step % 256]) * PAYLOAD_BYTES
        kept = list(range(5, step + 1, 5))[-keep:]
        assert _step_dirs(root) == [f"step_{s:06d}" for s in kept]
        assert len(_step_dirs(root)) <= keep
        assert _disk_bytes(root) <= keep * one + 100  # state.json grows by a digit at most
        if step > 5 * keep:
            assert [p.name for p in removed] == [f"step_{step - 5 * keep:06d}"]  # exactly the one that fell out
    assert not list(root.glob("*.tmp")) and not list(root.glob("*.deleting"))


def test_latest_is_kept_even_when_not_among_the_newest(tmp_path):
    # A kill between renaming step_30 into place and updating `latest` leaves latest -> step_20 with a complete
    # step_30 beside it; resume starts from step_20, so step_20 must survive a prune.
    root = tmp_path / "checkpoints"
    for step in (10, 20, 30):
        _save(root, step)
    (root / "latest").write_text("step_000020")
    assert [p.name for p in checkpoint.prune(root, keep=1)] == ["step_000010"]
    assert _step_dirs(root) == ["step_000020", "step_000030"]
    assert checkpoint.latest(root).name == "step_000020"


def test_a_checkpoint_being_written_is_never_touched(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        _save(root, step)
    in_progress = root / "step_000004.tmp"
    (in_progress / "deepspeed").mkdir(parents=True)  # a save in progress (no state.json yet)
    (in_progress / "deepspeed" / "shard.bin").write_bytes(b"x")
    checkpoint.prune(root, keep=1)
    assert _step_dirs(root) == ["step_000003", "step_000004.tmp"]
    assert (in_progress / "deepspeed" / "shard.bin").read_bytes() == b"x"


def test_a_killed_prune_is_finished_by_the_next(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        _save(root, step)
    (root / "step_000001").rename(root / "step_000001.deleting")  # killed after the rename, before the delete
    _save(root, 3)
    removed = checkpoint.prune(root, keep=1)
    assert sorted(p.name for p in removed) == ["step_000001", "step_000002"]
    assert _step_dirs(root) == ["step_000003"]


def test_no_latest_pointer_removes_nothing(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        _save(root, step)
    (root / "latest").unlink()
    assert checkpoint.prune(root, keep=1) == []
    assert len(_step_dirs(root)) == 3


def test_steps_are_ordered_by_number_not_by_name(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (999_999, 1_000_000):  # the 6-digit padding runs out: "step_1000000" < "step_999999" as text
        _save(root, step)
    checkpoint.prune(root, keep=1)
    assert _step_dirs(root) == ["step_1000000"]


def test_keep_must_be_at_least_one(tmp_path):
    _save(tmp_path, 1)
    with pytest.raises(ValueError, match="keep=0"):
        checkpoint.prune(tmp_path, keep=0)
    assert _step_dirs(tmp_path) == ["step_000001"]


def test_damaged_latest_pointer_is_an_error_not_a_silent_restart(tmp_path):
    """`latest` naming a folder without its state (deleted by hand, a partial copy) must not resume from step 0."""
    assert checkpoint.latest(tmp_path) is None  # no pointer: a fresh run
    (tmp_path / "step_000004").mkdir()
    (tmp_path / "latest").write_text("step_000004")
    with pytest.raises(FileNotFoundError,
                       match="names step_000004, which has no state.json: the checkpoint is damaged"):
        checkpoint.latest(tmp_path)


def test_full_disk_during_a_save_keeps_the_last_checkpoint(tmp_path):
    """ENOSPC while the learner writes its shards: a CheckpointError naming the intact checkpoint, the partial copy
    removed, `latest` unchanged (and still loadable)."""
    import errno

    _save(tmp_path, 1)

    def full_disk(directory: str) -> None:
        Path(directory).mkdir(parents=True)
        (Path(directory) / "shard").write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(checkpoint.CheckpointError, match=r"step_000002 not written \(No space left on device\); the "
                                                         r"last complete checkpoint \(step_000001\) is intact"):
        checkpoint.save(tmp_path, TrainState(2, 0, 0, checkpoint.capture_rng()), {}, full_disk)
    assert not (tmp_path / "step_000002.tmp").exists() and not (tmp_path / "step_000002").exists()
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000001"


# Timelines. A run resumed from step 20 while step_000030 (and a half-written step_000040.tmp) are on disk: a save
# killed before its pointer update, or a resume chosen from an older checkpoint. Those folders are the old timeline.


def _old_timeline(root: Path) -> None:
    for step in (10, 20, 30):
        _save(root, step)
    (root / "step_000040.tmp" / "deepspeed").mkdir(parents=True)  # a save killed mid-write


def test_abandon_moves_the_later_timeline_aside_and_keeps_latest_on_the_resumed_one(tmp_path):
    root = tmp_path / "checkpoints"
    _old_timeline(root)
    (root / "latest").write_text("step_000020")  # the kill came between step_30's rename and its pointer update
    moved = checkpoint.abandon_later_checkpoints(root, resumed_step=20)
    dest = root / "abandoned" / "001_resumed_from_step_000020"
    assert moved == [dest / "step_000030", dest / "step_000040.tmp"]  # lowest step first; moved, not deleted
    assert checkpoint.load_state(dest / "step_000030").step == 30
    assert _step_dirs(root) == ["abandoned", "step_000010", "step_000020"]
    assert (root / "latest").read_text() == "step_000020" and not (dest / "latest").exists()

    # Resumed from step 10 this time, `latest` naming a moved one: the pointer moves with it and names step_10.
    (root / "latest").write_text("step_000020")
    moved = checkpoint.abandon_later_checkpoints(root, resumed_step=10)
    dest = root / "abandoned" / "002_resumed_from_step_000010"
    assert moved == [dest / "step_000020"]
    assert (dest / "latest").read_text() == "step_000020"  # the old timeline keeps its pointer
    assert checkpoint.latest(root) == root / "step_000010"
    assert not (root / "latest.tmp").exists()


def test_abandon_with_nothing_later_changes_nothing(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (10, 20):
        _save(root, step)
    assert checkpoint.abandon_later_checkpoints(root, resumed_step=20) == []
    assert _step_dirs(root) == ["step_000010", "step_000020"]  # no empty abandoned/ folder either
    assert (root / "latest").read_text() == "step_000020"
    assert checkpoint.abandon_later_checkpoints(tmp_path / "none", resumed_step=0) == []  # no checkpoints folder


def test_abandon_at_step_0_moves_every_checkpoint_and_the_pointer(tmp_path):
    """A fresh start (step 0) in a folder with checkpoints: all of them, and `latest`, are set aside."""
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        _save(root, step)
    moved = checkpoint.abandon_later_checkpoints(root, resumed_step=0)
    dest = root / "abandoned" / "001_resumed_from_step_000000"
    assert moved == [dest / "step_000001", dest / "step_000002"]
    assert (dest / "latest").read_text() == "step_000002"
    assert _step_dirs(root) == ["abandoned"] and checkpoint.latest(root) is None


def test_an_old_timeline_never_pushes_the_new_ones_out(tmp_path):
    # Resumed from step 20 without setting step_30 aside, then step 21 saved: latest -> step_21.
    # keep=2 by step number alone would keep step_30 (old timeline) and step_21, removing step_20 and step_10.
    # By timeline (steps <= 21): keep step_21 and step_20, remove step_10; step_30 is neither counted nor removed.
    root = tmp_path / "checkpoints"
    _old_timeline(root)
    (root / "latest").write_text("step_000020")
    _save(root, 21)
    assert [p.name for p in checkpoint.prune(root, keep=2)] == ["step_000010"]
    assert _step_dirs(root) == ["step_000020", "step_000021", "step_000030", "step_000040.tmp"]


def test_prune_never_removes_the_resumed_from_checkpoint_before_a_newer_one_is_complete(tmp_path):
    root = tmp_path / "checkpoints"
    _old_timeline(root)
    (root / "latest").write_text("step_000020")
    checkpoint.abandon_later_checkpoints(root, resumed_step=20)

    def failing_learner(directory: str) -> None:  # e.g. DeepSpeed's save raising; not an OSError
        Path(directory).mkdir(parents=True)
        raise RuntimeError("the learner's save failed")

    with pytest.raises(checkpoint.CheckpointError, match=r"step_000021 not written \(RuntimeError: the learner's "
                                                         r"save failed\); the last complete checkpoint "
                                                         r"\(step_000020\) is intact"):
        checkpoint.save(root, TrainState(21, 0, 21, {}), {}, failing_learner)
    (root / "step_000021.tmp").mkdir()  # and a second save of step 21 in progress
    assert [p.name for p in checkpoint.prune(root, keep=1)] == ["step_000010"]  # step_20 survives both
    assert _step_dirs(root) == ["abandoned", "step_000020", "step_000021.tmp"]
    _save(root, 21)  # now complete: step_20 may go
    assert [p.name for p in checkpoint.prune(root, keep=1)] == ["step_000020"]
    assert _step_dirs(root) == ["abandoned", "step_000021"]


def test_without_a_pointer_resume_takes_the_newest_published_checkpoint(tmp_path):
    """No `latest` (a kill between the first checkpoint's rename and its pointer): the newest complete `step_N`,
    never one under abandoned/, a `step_N.tmp` that has its state.json but was never renamed, or a `.deleting`."""
    root = tmp_path / "checkpoints"
    for step in (10, 20):
        _save(root, step)
    (root / "latest").unlink()
    (root / "abandoned" / "001_resumed_from_step_000000" / "step_000050").mkdir(parents=True)
    (root / "abandoned" / "001_resumed_from_step_000000" / "step_000050" / "state.json").write_text("{}")
    for name in ("step_000040.tmp", "step_000030.deleting", "step_000035"):  # step_35: no state.json
        (root / name).mkdir()
    (root / "step_000040.tmp" / "state.json").write_text("{}")
    (root / "step_000030.deleting" / "state.json").write_text("{}")
    assert checkpoint.newest_complete(root) == root / "step_000020"
    assert checkpoint.latest(root) == root / "step_000020"
    assert checkpoint.load_state(checkpoint.latest(root)).step == 20
    assert checkpoint.latest(tmp_path / "no_checkpoints_yet") is None
