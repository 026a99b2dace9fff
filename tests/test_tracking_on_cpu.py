"""The console line of a step: where the run is (step/total, elapsed, ETA) and a short summary; the JSONL file has
every figure, and survives a kill mid-write: a resumed run cuts the torn last line, readers skip bad lines and keep
the last record of a step logged twice."""

import json

import pytest

from shop_r1.config import LoggingConfig
from shop_r1.tracking import MetricsFileWarning, Tracker, read_metrics, scan_metrics


def test_console_line_has_progress_eta_and_a_summary(tmp_path, capsys, monkeypatch):
    clock = iter([100.0, 130.0, 140.0])  # start, after step 11 (start-up included), after step 12
    monkeypatch.setattr("shop_r1.tracking.time.perf_counter", lambda: next(clock))
    tracker = Tracker(tmp_path, LoggingConfig(wandb=False), "grpo", total_steps=20, first_step=10)
    tracker.log(11, {"reward/total": 1.5, "timing/step": 3.0, "rollout/response_tokens_mean": 40.0})
    tracker.log(12, {"reward/total": 2.0})
    tracker.close()
    lines = capsys.readouterr().out.splitlines()
    # After a resume at step 10: 1 step in 30 s (start-up included), 9 left = 4m30s; then the rate from the first
    # logged step on, 10 s per step, 8 left = 1m20s.
    assert lines[0] == "[grpo   11/20     30s ETA 4m30s] reward/total=1.5"
    assert lines[1] == "[grpo   12/20     40s ETA 1m20s] reward/total=2"
    records = [json.loads(x) for x in (tmp_path / "metrics_grpo.jsonl").read_text().splitlines()]
    assert records[0] == {"step": 11, "reward/total": 1.5, "timing/step": 3.0, "rollout/response_tokens_mean": 40.0}


def _tracker(run_dir, name="grpo", **kwargs):
    return Tracker(run_dir, LoggingConfig(wandb=False, console_every=0), name, **kwargs)


def test_torn_last_line_is_cut_on_reopen_and_the_lines_before_are_untouched(tmp_path):
    path = tmp_path / "metrics_grpo.jsonl"
    whole = b'{"step": 1, "reward/total": 1.5}\n{"step": 2, "reward/total": NaN}\n'
    path.write_bytes(whole + b'{"step": 3, "reward/to')  # killed inside step 3's write
    with pytest.warns(MetricsFileWarning, match=r"metrics_grpo.jsonl:3: torn last line cut before appending"):
        tracker = _tracker(tmp_path, first_step=2)
    assert path.read_bytes() == whole  # byte for byte: only the torn line went
    tracker.log(3, {"reward/total": 3.0})
    tracker.close()
    assert path.read_bytes() == whole + b'{"step": 3, "reward/total": 3.0}\n'
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]


@pytest.mark.parametrize("tail", [b"\x00\x00\x00\x00", b'{"step": 3, "reward/total": 3.0\n', b"  "])
def test_other_torn_tails_are_cut_too(tmp_path, tail):
    # Zero bytes (a host crash after the size grew), an unparseable line that did get its newline, blanks.
    path = tmp_path / "metrics_grpo.jsonl"
    whole = b'{"step": 1}\n{"step": 2}\n'
    path.write_bytes(whole + tail)
    with pytest.warns(MetricsFileWarning, match=r"metrics_grpo.jsonl:3: torn last line cut"):
        _tracker(tmp_path).close()
    assert path.read_bytes() == whole


def test_complete_lines_are_never_cut(tmp_path, recwarn):
    path = tmp_path / "metrics_grpo.jsonl"
    whole = b'{"step": 1}\nnot json in the middle\n{"step": 2}\n'
    path.write_bytes(whole)
    _tracker(tmp_path).close()
    assert path.read_bytes() == whole and not recwarn.list  # a bad middle line is the readers' to skip
    path.write_bytes(b'{"step": 1}\n{"step": 2}')  # whole JSON, only the newline missing (e.g. a hand-made file)
    tracker = _tracker(tmp_path)
    tracker.log(3, {})
    tracker.close()
    assert path.read_bytes() == b'{"step": 1}\n{"step": 2}\n{"step": 3}\n' and not recwarn.list
    (tmp_path / "new").mkdir()
    _tracker(tmp_path / "new", fsync=True).log(1, {"a": 1})  # a fresh file; fsync per line
    assert (tmp_path / "new" / "metrics_grpo.jsonl").read_bytes() == b'{"step": 1, "a": 1.0}\n'


def test_read_metrics_keeps_the_last_record_of_a_step_and_skips_bad_lines(tmp_path):
    path = tmp_path / "metrics_grpo.jsonl"
    # A run killed after step 3 (checkpoint at step 1) and resumed: steps 2 and 3 are logged again.
    path.write_text('{"step": 0, "val/exact": 0.1}\n{"step": 1, "x": 1}\n{"step": 2, "x": 20}\n'
                    '{"step": 3, "x": 30}\n[1, 2]\n{"step": 2, "x": 2}\n{"step": 3, "x": 3}\n{"step": 4, "x')
    with pytest.warns(MetricsFileWarning) as caught:
        read = scan_metrics(path)
    assert [str(w.message) for w in caught] == [
        f"{path}:5: line skipped (not an object with an integer 'step')",
        f"{path}:8: torn last line skipped (not JSON: Unterminated string starting at, column 13)"]
    assert read.records == ({"step": 0, "val/exact": 0.1}, {"step": 1, "x": 1}, {"step": 2, "x": 2},
                            {"step": 3, "x": 3})
    assert read.skipped == (f"{path}:5", f"{path}:8") and read.torn_last_line
    with pytest.warns(MetricsFileWarning):
        assert read_metrics(path) == list(read.records)
    path.write_bytes(b'{"step": 1}\n\xe9t\xe9\n')  # not UTF-8
    with pytest.warns(MetricsFileWarning, match=r"metrics_grpo.jsonl:2: line skipped \(not UTF-8\)"):
        assert read_metrics(path) == [{"step": 1}]
