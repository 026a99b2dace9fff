"""experiments/curves.py's pure parts on a hand-made workspace: the cost table (cumulative SFT cycles, GRPO chunks,
their evaluations, a point not yet evaluated left out), the plateau rule and the figure. No model, no Ray."""

import json

import pytest

from experiments.curves import _grpo_tokens, _sft_tokens, plateau_cycle, plot, table


def _write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _point(root, name, exact, kappa=0.5):
    _write(root / "points" / name / "metrics.json",
           {"n": 100, "exact_match": exact, "type_kappa": kappa, "exact_match_non_terminate": exact - 0.1})


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "ws"
    _write(root / "sft" / "hf" / "done.json", {"steps": 500, "seconds": 1000.0})
    _point(root, "sft", 0.40)
    for k, (secs, tokens, exact) in enumerate([(100.0, 3000, 0.44), (110.0, 3100, 0.46), (90.0, 2900, 0.47)], 1):
        _write(root / "sft_more" / f"cycle_{k}" / "hf" / "done.json",
               {"steps": 136, "seconds": secs, "loss_tokens": tokens})
        _point(root, f"sft+{k}", exact)
    # cycle 4 trained but not evaluated yet: not a point
    _write(root / "sft_more" / "cycle_4" / "hf" / "done.json", {"steps": 136, "seconds": 100.0})
    _write(root / "grpo_sft" / "start.json", {"start": str(root / "sft" / "hf")})
    _point(root, "grpo_sft_0", 0.40)
    for k, (secs, exact) in enumerate([(200.0, 0.41), (210.0, 0.43)], 1):
        _write(root / "grpo_sft" / f"chunk_{k}" / "done.json",
               {"steps": 100 * k, "seconds": secs, "learner_tokens": 1000 * k})
        _point(root, f"grpo_sft_{k}", exact)
    return root


def test_table_accumulates_each_curve_from_the_starting_sft(workspace):
    out = table(workspace)
    rows = {r["name"]: r for r in out["rows"]}
    assert list(rows) == ["sft", "sft+1", "sft+2", "sft+3", "grpo_sft_0", "grpo_sft_1", "grpo_sft_2"]
    assert rows["sft"]["steps_after_sft"] == 0 and rows["sft"]["exact"] == 0.40
    # SFT cycles add up: 3 x 136 steps, 100 + 110 + 90 s, 3000 + 3100 + 2900 tokens; clean = steps x the median
    # cycle's seconds per step (100 / 136), the cycle that ran slower (110 s) not counted
    assert rows["sft+3"]["steps_after_sft"] == 408 and rows["sft+3"]["wall_s_after_sft"] == 300.0
    assert rows["sft+3"]["learner_tokens_after_sft"] == 9000
    assert rows["sft+3"]["clean_s_after_sft"] == pytest.approx(300.0, abs=0.05)
    assert out["sft_seconds_per_step"] == pytest.approx(100 / 136)
    assert out["start"]["clean_seconds_here"] == pytest.approx(500 * 100 / 136, abs=0.05)
    # GRPO chunks are one resumed run: steps as recorded, seconds summed, tokens as recorded (cumulative already);
    # per-step rates of the chunks 200/100 and 210/100: the median 2.05 s
    assert rows["grpo_sft_2"]["steps_after_sft"] == 200 and rows["grpo_sft_2"]["wall_s_after_sft"] == 410.0
    assert rows["grpo_sft_2"]["learner_tokens_after_sft"] == 2000
    assert rows["grpo_sft_2"]["clean_s_after_sft"] == pytest.approx(410.0)
    assert out["grpo_seconds_per_step"] == {"sft": pytest.approx(2.05)}
    assert rows["grpo_sft_1"]["from"] == "sft/hf" and rows["grpo_sft_1"]["kind"] == "grpo_sft"
    assert rows["sft+2"]["exact_non_terminate"] == pytest.approx(0.36)
    assert out["start"]["steps"] == 500


def test_plateau_is_where_no_later_cycle_beats_the_best_so_far_by_more_than_a_point():
    assert plateau_cycle([0.40, 0.44, 0.46, 0.47]) is None           # still rising
    assert plateau_cycle([0.40, 0.44, 0.46, 0.465, 0.455]) == 2      # after 0.46: 0.465 and 0.455, within a point
    # a flat pair followed by a rise is not a plateau: the first flat stretch (cycles 3-4) is passed over
    assert plateau_cycle([0.40, 0.45, 0.472, 0.481, 0.477, 0.497, 0.526, 0.52, 0.53]) == 6
    assert plateau_cycle([0.40, 0.50, 0.45, 0.47, 0.505]) == 1       # a dip, then nothing above 0.50 + 0.01
    assert plateau_cycle([0.40, 0.41]) is None                       # too short to say
    assert plateau_cycle([0.40, 0.42, 0.41], window=1) == 1


def test_token_counts_take_each_step_once(tmp_path):
    lines = [{"step": 1, "sft/loss_tokens": 10.0}, {"step": 2, "sft/loss_tokens": 20.0},
             {"step": 2, "sft/loss_tokens": 22.0}]  # step 2 logged again after a restart: the last counts
    (tmp_path / "metrics_sft.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert _sft_tokens(tmp_path) == 32
    grpo = [{"step": 0, "val/exact": 0.4}, {"step": 1, "rollout/response_tokens_mean": 50.0},
            {"step": 2, "rollout/response_tokens_mean": 60.0}, {"step": 3, "rollout/response_tokens_mean": 70.0}]
    (tmp_path / "metrics_grpo.jsonl").write_text("\n".join(json.dumps(x) for x in grpo) + "\n")
    assert _grpo_tokens(tmp_path, upto=2, batch=32) == (50 + 60) * 32


def test_a_grpo_curve_from_an_sft_cycle_starts_at_that_cycles_cost(workspace):
    _write(workspace / "grpo_sft_2" / "start.json", {"start": str(workspace / "sft_more" / "cycle_2" / "hf")})
    _point(workspace, "grpo_sft_2_0", 0.46)
    _write(workspace / "grpo_sft_2" / "chunk_1" / "done.json", {"steps": 100, "seconds": 300.0,
                                                                "learner_tokens": 500})
    _point(workspace, "grpo_sft_2_1", 0.50)
    rows = {r["name"]: r for r in table(workspace)["rows"]}
    # sft+2: 272 steps, 210 s, 6100 tokens, clean 272 x 100 / 136 = 200 s; GRPO adds 100 steps at 3 s each
    assert rows["grpo_sft_2_0"]["steps_after_sft"] == 272 and rows["grpo_sft_2_0"]["grpo_steps"] == 0
    assert rows["grpo_sft_2_0"]["clean_s_after_sft"] == pytest.approx(200.0, abs=0.05)
    one = rows["grpo_sft_2_1"]
    assert (one["steps_after_sft"], one["grpo_steps"], one["wall_s_after_sft"], one["learner_tokens_after_sft"]) == (
        372, 100, 510.0, 6600)
    assert one["clean_s_after_sft"] == pytest.approx(500.0, abs=0.05) and one["from"] == "sft_more/cycle_2/hf"
    assert rows["grpo_sft_1"]["steps_after_sft"] == 100  # from the starting SFT: no offset


def test_plot_writes_a_png(workspace, tmp_path):
    out = tmp_path / "curves.png"
    plot(table(workspace), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_names_the_points_not_yet_evaluated(workspace):
    from experiments.curves import compare_points

    (workspace / "points" / "sft" / "predictions.jsonl").write_text("")
    with pytest.raises(SystemExit, match=r"points: no evaluated point sft\+9, grpo_sft_7$"):
        compare_points(workspace, ["sft", "sft+9", "grpo_sft_7"], reference="sft")


def test_export_keeps_the_costs_points_and_baselines_without_the_models(workspace, tmp_path, monkeypatch):
    """An export (what gets committed) reads as the workspace does: the same table, the same comparison, with the
    baselines scored into it instead of the data; no model file goes with it."""
    import shop_r1.comparison as comparison
    from experiments.curves import compare_points, export
    from shop_r1.metrics import Predictions, write_predictions
    from shop_r1.types import Action

    targets = (Action("click", "a"), Action("terminate"), Action("click", "b"), Action("terminate"))
    ids = ("s1/0", "s1/1", "s2/0", "s2/1")
    answer = '{{"rationale": "r", "action": {}}}'
    for name, picks in [("sft", "ab"), ("sft+1", "aa"), ("sft+2", "ab"), ("sft+3", "bb"), ("grpo_sft_0", "ab"),
                        ("grpo_sft_1", "ba"), ("grpo_sft_2", "ab")]:
        responses = []
        for t, pick in zip(targets, picks * 2):
            responses.append(answer.format('{"type": "terminate"}' if pick == "b" else
                                           '{"type": "click", "name": "%s"}' % (t.name or "x")))
        write_predictions(Predictions(ids, tuple(responses), targets),
                          workspace / "points" / name / "predictions.jsonl")
    (workspace / "sft" / "hf" / "model.safetensors").write_bytes(b"weights")
    (workspace / "data").mkdir()
    (workspace / "data" / "rl_train.jsonl").write_text("")
    (workspace / "data" / "rl_val.jsonl").write_text("")
    always = comparison.Setting("always terminate", "baseline",
                                Predictions(ids, ('{"rationale": "", "action": {"type": "terminate"}}',) * 4, targets),
                                note="the same answer everywhere", name="always_terminate")
    monkeypatch.setattr(comparison, "baseline_settings", lambda train, test: [always])

    out = tmp_path / "export"
    written = export(workspace, out)
    assert not list(out.rglob("*.safetensors")) and not (out / "data").exists()
    assert (out / "points" / "sft+2" / "predictions.jsonl.gz") in written
    assert (out / "baselines" / "always_terminate" / "about.json") in written
    assert table(out) == table(workspace)  # the costs and every point's metrics came along
    names = ["sft", "sft+3", "grpo_sft_2"]
    assert compare_points(out, names, "sft") == compare_points(workspace, names, "sft")
    assert "always terminate" in compare_points(out, names, "sft")
    assert export(workspace, out) == written  # a re-export rewrites the same files
