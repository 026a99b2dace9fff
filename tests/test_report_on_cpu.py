"""`shop-r1 report`: a hand-made run folder -> Markdown with the expected numbers, and real PNG files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shop_r1.cli import main
from shop_r1.report import load_metrics, make_report
from shop_r1.tracking import MetricsFileWarning

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _grpo_record(step: int, total: float, terminate: float) -> dict:
    return {"step": step, "reward/format": 0.5, "reward/action_type": 0.3, "reward/attribute": 0.1,
            "reward/value": 0.2, "reward/self_certainty": 0.01, "reward/total": total,
            "rollout/type_click": 1 - terminate, "rollout/type_type_and_submit": 0.0,
            "rollout/type_terminate": terminate, "rollout/type_invalid": 0.0, "train/kl": 0.001 * step,
            "timing/rollout": 6.0, "timing/reward": 1.0, "timing/update": 2.0, "timing/weight_sync": 0.5,
            "timing/other": 0.5, "timing/step": 10.0}


def _run_folder(tmp_path: Path, torn: bool = False) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps(_grpo_record(s, t, m)) for s, t, m in [(1, 1.0, 0.25), (2, 1.5, 0.5), (3, 2.0, 0.75)]]
    text = "\n".join(lines) + "\n" + ('{"step": 4, "reward/to' if torn else "")
    (run / "metrics_grpo.jsonl").write_text(text)
    (run / "metrics_sft.jsonl").write_text("\n".join(json.dumps({"step": s, "sft/loss": 3.0 - s}) for s in (1, 2)))
    for name, label, em in [("sft", "SFT", 0.25), ("zero_shot", "Zero-shot prompting", 0.0),
                            ("shop_r1", "Shop-R1", 0.5)]:
        (run / "eval" / name).mkdir(parents=True)
        (run / "eval" / name / "metrics.json").write_text(json.dumps(
            {"label": label, "n": 8, "exact_match": em, "type_accuracy": 0.5, "type_macro_f1": 0.4,
             "reward/total": 1.25}))
    return run


def test_report_numbers_plots_and_order(tmp_path):
    run = _run_folder(tmp_path)
    report = make_report(run)
    md = report.markdown_path.read_text()
    # Eval rows in pipeline order, not file-name order.
    assert md.index("Zero-shot prompting") < md.index("| SFT |") < md.index("| Shop-R1 |")
    # metrics.json files of before kappa, exact on non-terminate and the predicted mix: those cells are dashes.
    assert "| Shop-R1 | 50.00% | 50.00% | 40.00% | – | – | – | 1.250 | 8 |" in md
    assert "## Against the baselines" not in md  # no predictions.jsonl to redo the table from
    # first / last / mean of reward/total = 1.0 / 2.0 / 1.5; terminate share 0.25 -> 0.75 (collapse visible).
    assert "| `reward/total` | 1.000 | 2.000 | 1.500 |" in md
    assert "| `rollout/type_terminate` | 0.250 | 0.750 | 0.500 |" in md
    # Stage shares: rollout 3 x 6 s of 3 x 10 s = 60%; the five stages sum to the step.
    assert "| rollout | 18.0 | 60.0% |" in md and "| weight_sync | 1.5 | 5.0% |" in md
    assert "loss 2.0000 -> 1.0000" in md
    names = sorted(p.name for p in report.plots)
    assert names == ["action_mix.png", "kl.png", "reward_terms.png", "sft_loss.png", "timing.png"]
    for p in report.plots:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 2000
        assert f"]({p.name})" in md


def test_eval_table_shows_kappa_exact_on_non_terminate_and_the_mix(tmp_path):
    run = _run_folder(tmp_path)
    (run / "eval" / "sft" / "metrics.json").write_text(json.dumps(
        {"label": "SFT", "n": 8, "exact_match": 0.25, "type_accuracy": 0.5, "type_macro_f1": 0.4, "type_kappa": 0.125,
         "exact_match_non_terminate": 0.2, "predicted_mix": {"click": 0.5, "type_and_submit": 0.125,
                                                             "terminate": 0.25, "invalid": 0.125},
         "reward/total": 1.0}))
    md = make_report(run).markdown_path.read_text()
    assert "| SFT | 25.00% | 50.00% | 40.00% | 0.125 | 20.00% | 50/12/25/12 | 1.000 | 8 |" in md


def test_torn_last_line_is_skipped_and_noted(tmp_path):
    run = _run_folder(tmp_path, torn=True)
    with pytest.warns(MetricsFileWarning, match=r"metrics_grpo.jsonl:4: torn last line skipped"):
        log = load_metrics(run / "metrics_grpo.jsonl")
    assert log.torn_last_line and [r["step"] for r in log.records] == [1, 2, 3]
    with pytest.warns(MetricsFileWarning):
        report = make_report(run)
    assert any("torn last line" in n for n in report.notes)
    assert "torn last line" in report.markdown_path.read_text()


def test_malformed_middle_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path):
    path = tmp_path / "metrics_grpo.jsonl"
    path.write_text('{"step": 1, "reward/total": 1}\nnot json\n{"step": 3}\n')
    with pytest.warns(MetricsFileWarning, match=r"metrics_grpo.jsonl:2: line skipped \(not JSON"):
        log = load_metrics(path)
    assert log.records == ({"step": 1, "reward/total": 1}, {"step": 3}) and not log.torn_last_line
    path.write_text('{"step": "one"}\n{"step": 2}\n')
    with pytest.warns(MetricsFileWarning, match=r"metrics_grpo.jsonl:1: line skipped \(not an object with an "
                                                r"integer 'step'\)"):
        assert load_metrics(path).records == ({"step": 2},)


def test_a_step_logged_again_after_a_resume_keeps_its_last_record(tmp_path):
    path = tmp_path / "metrics_grpo.jsonl"
    # Steps 1-3 logged, checkpoint at 2, killed; the resumed run logs 3 and 4 again.
    path.write_text("".join(json.dumps({"step": s, "reward/total": v}) + "\n"
                            for s, v in [(1, 1.0), (2, 2.0), (3, 30.0), (3, 3.0), (4, 4.0)]))
    log = load_metrics(path)
    assert [(r["step"], r["reward/total"]) for r in log.records] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    assert log.series("reward/total") == ([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])  # not 30, not counted twice


def test_report_cli_and_empty_folder(tmp_path, capsys):
    run = _run_folder(tmp_path)
    main(["report", str(run), "--out-dir", str(tmp_path / "rep")])
    assert "report:" in capsys.readouterr().out and (tmp_path / "rep" / "report.md").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no metrics_grpo.jsonl"):
        make_report(tmp_path / "empty")


def test_report_shows_sample_rollouts_and_time_per_stage(tmp_path):
    run = _run_folder(tmp_path)
    reward = {"format": 0.5, "action_type": 0.3, "attribute": 0.2, "value": 1000.0, "self_certainty": 6.5,
              "total": 1001.0325, "format_valid": True, "error": None}
    groups = [{"step": s, "example_id": f"ex{s}", "prompt_token_ids": [1, 2],
               "samples": [{"text": f'{{"rationale": "step {s} sample {i}"}}', "token_ids": [3], "logprobs": [-0.1],
                            "finish_reason": "stop", "reward": reward, "advantage": 0.5 - i,
                            "policy_version": s - 1} for i in range(3)]} for s in (1, 2, 3)]
    (run / "rollouts.jsonl").write_text("\n".join(json.dumps(g) for g in groups) + "\n{\"step\": 4, \"tor")
    (run / "stage_seconds.json").write_text(json.dumps({"SFT": 500.0, "GRPO (Shop-R1)": 250.4}))
    text = make_report(run).markdown_path.read_text()
    rollouts = text[text.index("## Sample rollouts"):text.index("## Time per stage")]
    assert "step 1, example `ex1`" in rollouts.lower() and "step 3, example `ex3`" in rollouts.lower()
    assert "step 2" not in rollouts.lower().replace("step 1 and of step 3", "")  # first and last step only
    assert rollouts.count("- total 1001.03") == 4  # 2 samples of each
    assert "advantage +0.500, policy version 0" in rollouts and "step 3 sample 1" in rollouts
    assert "| SFT | 500 |" in text and "| GRPO (Shop-R1) | 250 |" in text and "| total | 750 |" in text
