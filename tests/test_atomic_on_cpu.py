"""Atomic writes (shop_r1/atomic.py): the content is replaced whole, no temporary is left, a failure mid-write leaves
the old file, and the order of fsyncs and the rename is the durable one. A real kill mid-write runs in a child."""

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shop_r1.atomic import open_atomic, publish_atomically, write_atomic

REPO = Path(__file__).resolve().parents[1]


def test_write_replaces_the_content_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "stages.json"
    path.write_text("old content, longer than the new one\n")
    write_atomic(path, "new")
    assert path.read_text() == "new"  # not "new content, longer ...": replaced, not overwritten in place
    write_atomic(path, b"\x00bytes\xff")
    assert path.read_bytes() == b"\x00bytes\xff"
    write_atomic(tmp_path / "fresh.txt", "é")  # a file that did not exist; text is UTF-8
    assert (tmp_path / "fresh.txt").read_bytes() == "é".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.txt", "stages.json"]


def test_the_new_file_has_the_umasks_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "config.yaml", "a: 1\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "config.yaml").stat().st_mode) == 0o644  # as open(); not mkstemp's 0o600


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_text('{"old": 1}\n')
    with pytest.raises(ValueError, match="line 2 is bad"), open_atomic(path) as f:
        f.write('{"new": 1}\n')
        raise ValueError("line 2 is bad")
    assert path.read_text() == '{"old": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["rollouts.jsonl"]


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "latest"
    path.write_text("step_000001")

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "step_000002")
    monkeypatch.undo()
    assert path.read_text() == "step_000001" and [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_the_file_is_fsynced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("rename", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_atomic(tmp_path / "done.json", "{}")
    monkeypatch.undo()
    (what, name), rest = events[0], events[1:]
    assert what == "fsync" and name.startswith(".done.json.") and name.endswith(".tmp")  # the data, in the temporary
    assert rest == [("rename", "done.json"), ("fsync", tmp_path.name)]  # then the name, then the name made durable


KILLED = """
import signal, sys
from shop_r1.atomic import open_atomic
with open_atomic(sys.argv[1]) as f:
    f.write("half of the new ")
    f.flush()
    signal.raise_signal(signal.SIGKILL)  # nothing after this runs: no cleanup
"""


def test_a_kill_mid_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old: true\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", KILLED, str(path)], env=env, cwd=REPO, timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert path.read_text() == "old: true\n"  # the half-written temporary is a leftover beside it, never the file
    assert [p.name for p in tmp_path.iterdir() if p.name != "config.yaml"][0].startswith(".config.yaml.")


def test_publish_replaces_a_folder_whole(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "old.bin").write_bytes(b"old")
    (tmp_path / ".model.tmp").mkdir()
    (tmp_path / ".model.tmp" / "new.bin").write_bytes(b"new")
    publish_atomically(tmp_path / ".model.tmp", tmp_path / "model")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["model", "model/new.bin"]
