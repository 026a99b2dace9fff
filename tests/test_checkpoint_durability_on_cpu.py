"""Checkpoint durability: what `save` makes durable before it publishes a name, and real write failures.

The failures are real, not mocked: a child process gets a file-size limit (RLIMIT_FSIZE, the kernel then fails a
write past it with EFBIG) or is SIGKILLed mid-save, and the parent checks what is left on disk.
"""

import errno
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shop_r1 import checkpoint
from shop_r1.checkpoint import TrainState

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 1 << 20  # the child's file-size limit; its payload is 4x that


def _save_with_tensor(root: Path, step: int) -> Path:
    def learner(directory: str) -> None:
        Path(directory).mkdir(parents=True)
        torch.save({"w": torch.full((4,), float(step))}, Path(directory) / "model.pt")

    return checkpoint.save(root, TrainState(step, 0, step, {}), {"rl": {"steps": 10}}, learner)


def _assert_step_1_in_force(root: Path) -> None:
    """`latest` still names step_000001 and everything in it loads."""
    assert (root / "latest").read_text() == "step_000001"
    found = checkpoint.latest(root)
    assert found == root / "step_000001" and checkpoint.load_state(found).step == 1
    assert torch.equal(torch.load(found / "deepspeed" / "model.pt")["w"], torch.full((4,), 1.0))


def test_save_fsyncs_every_file_then_the_folder_then_renames_then_fsyncs_the_parent(tmp_path, monkeypatch):
    # Spies that record and then do the real call: the order is the contract.
    events, real_fsync, real_replace = [], os.fsync, os.replace

    def named(text: str) -> str:  # an atomic write's temporary: .<name>.<8 random hex>.tmp
        return re.sub(r"\.[0-9a-f]{8}\.tmp$", ".<random>.tmp", text)

    def fsync(fd: int) -> None:
        events.append(("fsync", named(str(Path(os.readlink(f"/proc/self/fd/{fd}")).relative_to(tmp_path.resolve())))))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("rename", f"{named(Path(src).name)} -> {Path(dst).name}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    _save_with_tensor(tmp_path / "checkpoints", 1)
    monkeypatch.undo()
    assert events == [
        ("fsync", "."),  # checkpoints/ was created: its entry in the run folder
        ("fsync", "checkpoints/step_000001.tmp/deepspeed/model.pt"),  # files before their folder
        ("fsync", "checkpoints/step_000001.tmp/deepspeed"),
        ("fsync", "checkpoints/step_000001.tmp/state.json"),
        ("fsync", "checkpoints/step_000001.tmp"),
        ("rename", "step_000001.tmp -> step_000001"),
        ("fsync", "checkpoints"),  # the rename made durable
        ("fsync", "checkpoints/.latest.<random>.tmp"),  # then the pointer, the same way
        ("rename", ".latest.<random>.tmp -> latest"),
        ("fsync", "checkpoints"),
    ]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000001"]
    _assert_step_1_in_force(tmp_path / "checkpoints")


def test_publish_replaces_a_folder_and_a_file_and_leaves_no_temporaries(tmp_path):
    (tmp_path / "step_000001" / "old.bin").parent.mkdir()
    (tmp_path / "step_000001" / "old.bin").write_bytes(b"old")
    (tmp_path / "step_000001.tmp" / "sub").mkdir(parents=True)
    (tmp_path / "step_000001.tmp" / "sub" / "new.bin").write_bytes(b"new")
    checkpoint.publish_atomically(tmp_path / "step_000001.tmp", tmp_path / "step_000001")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "step_000001", "step_000001/sub", "step_000001/sub/new.bin"]  # no .tmp, no .deleting, old.bin gone

    (tmp_path / "latest").write_text("step_000000")
    (tmp_path / "latest.tmp").write_text("step_000001")
    checkpoint.publish_atomically(tmp_path / "latest.tmp", tmp_path / "latest")
    assert (tmp_path / "latest").read_text() == "step_000001" and not (tmp_path / "latest.tmp").exists()


CHILD = """
import json, resource, signal, sys
from pathlib import Path
import torch
from shop_r1 import checkpoint

root, writer, limit = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def learner(directory):  # the payload is 4x the limit
    Path(directory).mkdir()
    if writer == "torch.save":
        torch.save({"w": torch.zeros(limit)}, Path(directory) / "model.pt")  # float32: 4 bytes each
    elif writer == "plain":
        with open(Path(directory) / "model.pt", "wb") as f:
            f.write(b"x" * 4 * limit)
    else:  # "kill": killed mid-write, nothing runs after (no cleanup)
        with open(Path(directory) / "model.pt", "wb") as f:
            f.write(b"x" * limit)
            f.flush()
            signal.raise_signal(signal.SIGKILL)

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    checkpoint.save(root, checkpoint.TrainState(2, 0, 2, {}), {}, learner)
except checkpoint.CheckpointError as e:
    print(json.dumps({"cause": type(e.__cause__).__name__, "errno": e.errno, "message": str(e)}))
"""


def _child_save(root: Path, writer: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", CHILD, str(root), writer, str(LIMIT_BYTES)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)


@pytest.mark.parametrize(("writer", "cause", "errno_", "reason"), [
    ("plain", "OSError", errno.EFBIG, r"File too large"),
    # torch.save's zip writer turns the failed write into a RuntimeError with no errno and no Python cause.
    ("torch.save", "RuntimeError", None, r"RuntimeError: .+"),
], ids=["plain_write", "torch_save"])
def test_a_real_write_failure_is_a_failed_save_and_the_last_checkpoint_stays(tmp_path, writer, cause, errno_, reason):
    root = tmp_path / "checkpoints"
    _save_with_tensor(root, 1)
    child = _child_save(root, writer)
    assert child.returncode == 0, child.stderr
    failure = json.loads(child.stdout)
    assert (failure["cause"], failure["errno"]) == (cause, errno_)
    assert failure["message"].startswith(f"[Errno {errno_}] " if errno_ else "checkpoint ")
    assert re.search(rf"checkpoint {re.escape(str(root))}/step_000002 not written \({reason}\); the last complete "
                     r"checkpoint \(step_000001\) is intact and `--resume` continues from it", failure["message"])
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]  # the partial copy is gone
    _assert_step_1_in_force(root)


def test_a_save_killed_mid_write_is_never_published_and_the_next_save_replaces_it(tmp_path):
    root = tmp_path / "checkpoints"
    _save_with_tensor(root, 1)
    child = _child_save(root, "kill")
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001", "step_000002.tmp"]  # left as .tmp
    assert (root / "step_000002.tmp" / "deepspeed" / "model.pt").stat().st_size == LIMIT_BYTES
    _assert_step_1_in_force(root)
    assert checkpoint.newest_complete(root) == root / "step_000001"
    assert checkpoint.prune(root, keep=1) == []  # a .tmp is never touched
    _save_with_tensor(root, 2)  # the step saved again: the leftover is replaced, then published
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001", "step_000002"]
    assert torch.equal(torch.load(checkpoint.latest(root) / "deepspeed" / "model.pt")["w"], torch.full((4,), 2.0))
