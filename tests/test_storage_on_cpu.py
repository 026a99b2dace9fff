"""Mirroring a run folder to a storage URI (file:// stands in for s3:// / gs://, the same pyarrow code path)."""

import pytest

from shop_r1.storage import StorageError, mirror_or_warn, mirror_run


def _run(tmp_path):
    run = tmp_path / "run"
    (run / "grpo" / "checkpoints" / "step_2").mkdir(parents=True)
    (run / "metrics_grpo.jsonl").write_text('{"step": 1}\n')
    (run / "grpo" / "checkpoints" / "step_2" / "state.json").write_bytes(b"x" * 1000)
    return run


def test_mirror_copies_every_file_and_is_idempotent(tmp_path):
    run = _run(tmp_path)
    uri = f"file://{tmp_path / 'bucket' / 'prefix'}"
    result = mirror_run(run, uri)
    assert (result.num_files, result.num_bytes) == (2, 12 + 1000)
    assert (tmp_path / "bucket/prefix/grpo/checkpoints/step_2/state.json").read_bytes() == b"x" * 1000
    (run / "metrics_grpo.jsonl").write_text('{"step": 1}\n{"step": 2}\n')  # a later mirror carries the new lines
    mirror_run(run, uri)
    assert (tmp_path / "bucket/prefix/metrics_grpo.jsonl").read_text().count("step") == 2


def test_mirror_errors_name_the_place(tmp_path, capsys):
    with pytest.raises(StorageError, match="does not exist"):
        mirror_run(tmp_path / "missing", f"file://{tmp_path / 'b'}")
    run = _run(tmp_path)
    with pytest.raises(StorageError, match="nosuchscheme://bucket"):
        mirror_run(run, "nosuchscheme://bucket/x")
    assert mirror_or_warn(run, "nosuchscheme://bucket/x") is None  # mid-run: warn, keep training
    assert "WARNING: storage: mirroring" in capsys.readouterr().out
    assert mirror_or_warn(run, "") is None
