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
