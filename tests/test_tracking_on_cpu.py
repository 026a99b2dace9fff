"""The console line of a step: where the run is (step/total, elapsed, ETA) and a short summary; the JSONL file has
every figure."""

import json

from shop_r1.config import LoggingConfig
from shop_r1.tracking import Tracker


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
