"""The v2 experiment suites (issue 21, section 5): their rows, the "SFT continued" arithmetic and wiring, sft.max_steps,
and the multi-seed summary (mean ± SD, paired differences, oracle, predictions, plots) on fake workspaces. Nothing
here trains: the learner, run_sft and every model are fakes or absent."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import experiments.run as run
import experiments.suites as suites
import experiments.summarize as summarize
from shop_r1.config import ConfigError, load_config, save_config
from shop_r1.data.examples import build_rl_examples, load_rl_examples, write_examples_jsonl
from shop_r1.learner.sft_data import SFTSequence, TokenizedSFT
from tests.test_comparison_on_cpu import (
    ADD,
    CHECKOUT,
    PNG_MAGIC,
    SFT_RESPONSES,
    SHOP_R1_RESPONSES,
    VIEW,
    T,
    _data,
    _r,
    _write_eval,
)

SQRT2 = 2 ** 0.5


def _base(*overrides: str):
    return load_config(None, [*run.V2_FORCED, *overrides])


def _names(suite) -> list[str]:
    return [r.name for r in suite.rows]


# ---------------------------------------------------------------------------------------------- suites


def test_v2_table2_rows():
    suite = suites.v2_suite("v2_table2", _base())
    assert _names(suite) == ["zero_shot", "sft", "sft_continued", "sft_rl_binary", "shop_r1"]
    assert [r.model for r in suite.rows] == ["base", "sft", "sft_continued", "rl", "rl"]
    assert suite.workspace == "v2" and suite.notes == ()
    # The main job's config leaves the zero-shot row out (eval.zero_shot=false): so does the suite, and says so.
    short = suites.v2_suite("v2_table2", _base("eval.zero_shot=false"))
    assert _names(short) == ["sft", "sft_continued", "sft_rl_binary", "shop_r1"]
    assert short.notes == ("Zero-shot (untrained): left out, the base config has eval.zero_shot=false",)


def test_v2_table4_measures_each_switch_against_the_base():
    suite = suites.v2_suite("v2_table4", _base())
    assert _names(suite) == ["sft", "no_format_reward", "no_rationale_reward", "no_reward_scale",
                             "binary_action_reward", "click_guard_true", "self_certainty_breaks_ties_false",
                             "scale_rewards_none", "shop_r1"]
    assert suite.rows[5].rl_overrides == ("reward.click_guard=true",) and suite.notes == ()
    # A main job that adopted two switches: their rows measure leaving them, and say so.
    tuned = suites.v2_suite("v2_table4", _base("reward.click_guard=true", "rl.scale_rewards=none"))
    assert _names(tuned)[5:8] == ["click_guard_false", "self_certainty_breaks_ties_false", "scale_rewards_group"]
    assert tuned.rows[7].label == "Shop-R1, rl.scale_rewards=group"
    assert len(tuned.notes) == 2 and "reward.click_guard=true" in tuned.notes[0]
    # An ablation the base config already has would repeat the Shop-R1 run: left out, with a note.
    no_format = suites.v2_suite("v2_table4", _base("reward.format_reward=false"))
    assert "no_format_reward" not in _names(no_format) and "left out" in no_format.notes[0]


def test_v2_regime_is_sft_sft_continued_and_shop_r1_under_the_regimes_overrides():
    suite = suites.v2_suite("v2_regime", _base("data.rationale_fraction=0.2"))
    assert _names(suite) == ["sft", "sft_continued", "shop_r1"] and suite.notes == ()
    assert suite.rows[2].rl_overrides == ()  # the regime is in the base config, not in a row


def test_v2_fig2_reuses_the_shop_r1_run_at_the_base_temperature():
    suite = suites.v2_suite("v2_fig2", _base("rollout.temperature=0.6"))
    assert _names(suite) == ["sft", "temperature_0.2", "temperature_0.4", "shop_r1", "temperature_0.8",
                             "temperature_1.0"]
    assert suite.rows[3].label == "Shop-R1, T=0.6" and suite.rows[3].rl_overrides == ()
    off_grid = suites.v2_suite("v2_fig2", _base("rollout.temperature=0.7"))
    assert _names(off_grid) == ["sft", *(f"temperature_{t}" for t in suites.TEMPERATURES), "shop_r1"]
    assert off_grid.rows[-1].label == "Shop-R1, T=0.7 (base config)"
    with pytest.raises(KeyError, match="v2_table9"):
        suites.v2_suite("v2_table9", _base())


def test_v2_base_config_forces_the_new_shop_and_the_test_split_and_refuses_seed_overrides():
    cfg = run.v2_base_config(run.V2_BASE_CONFIG, ["rl.steps=3"])
    assert (cfg.data.synth_version, cfg.eval.split, cfg.logging.wandb, cfg.rl.steps) == (4, "test", False, 3)
    assert run.v2_base_config(run.V2_BASE_CONFIG, ["data.synth_version=2"]).data.synth_version == 2
    with pytest.raises(ConfigError, match="profiled shop"):
        run.v2_base_config(run.V2_BASE_CONFIG, ["data.synth_version=1"])
    for bad in ("seed=3", "data.synth_seed=3", "eval.split=val"):
        with pytest.raises(ConfigError, match="--seeds"):
            run.v2_base_config(run.V2_BASE_CONFIG, [bad])


def test_seed_workspaces_refuse_another_config(tmp_path):
    base = _base(f"run_dir={tmp_path / 'scratch'}")
    ws = run.open_seed_workspace(base, tmp_path, 2)
    assert ws.root == tmp_path / "v2" / "seed2" and (ws.cfg.seed, ws.cfg.data.synth_seed) == (2, 2)
    assert load_config(ws.root / "config.yaml") == ws.cfg
    # Same settings (only what cannot change a result differs): reopened. Another setting: refused, named.
    run.open_seed_workspace(load_config(None, [*run.V2_FORCED, f"run_dir={tmp_path / 'x'}", "logging.console_every=5"]),
                            tmp_path, 2)
    # Nor what a resumed run may change (the learner's exactly-equal forwards, placement): a workspace made before a
    # default of that kind changed is the same experiment.
    run.open_seed_workspace(_base(f"run_dir={tmp_path / 'scratch'}", "learner.attention=dense",
                                  "learner.max_tokens_per_micro_batch=4096"), tmp_path, 2)
    with pytest.raises(ConfigError, match=r"rl\.steps: 500 -> 7"):
        run.open_seed_workspace(_base(f"run_dir={tmp_path / 'scratch'}", "rl.steps=7"), tmp_path, 2)


def test_command_line():
    args = run.parser().parse_intermixed_args(["v2_table2", "rl.steps=3", "--seeds", "0", "1"])
    assert (args.suite, args.seeds, args.overrides) == ("v2_table2", [0, 1], ["rl.steps=3"])
    with pytest.raises(SystemExit):
        run.main(["table2", "--seeds", "1"])  # refused before anything runs


def _fake_main_job(run_dir: Path, cfg) -> None:
    """A finished pipeline run folder as `shop-r1 pipeline` leaves it (the files adopt_run reads)."""
    save_config(cfg, run_dir / "config.yaml")
    for f, text in (("data/stats.json", "{}"), ("data/rl_test.jsonl", "t\n"), ("data/sft_train.jsonl", "s\n"),
                    ("model/shop_lm/shop_r1_model.json", "{}"), ("sft/hf/config.json", "{}"),
                    ("sft/hf/model.safetensors", "w"), ("grpo/hf/config.json", "{}"), ("rollouts.jsonl", "r\n"),
                    ("stage_seconds.json", json.dumps({"SFT": 1100.0, "GRPO (Shop-R1)": 150.0, "SFT eval": 30.0})),
                    ("metrics_sft.jsonl", '{"step": 1, "sft/loss": 7.5}\n{"step": 544, "sft/loss": 0.4}\n'),
                    ("metrics_grpo.jsonl",
                     '{"step": 1, "reward/total": 300.0}\n{"step": 100, "reward/total": 500.0}\n')):
        (run_dir / f).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / f).write_text(text)


def test_adopt_a_main_job_run_as_a_seed_workspace(tmp_path, monkeypatch):
    ws = run.open_seed_workspace(_base(f"run_dir={tmp_path / 'scratch'}"), tmp_path, 31)
    main = tmp_path / "main"
    # run_dir, logging: not results
    _fake_main_job(main, run.with_overrides(ws.cfg, [f"run_dir={main}", "logging.wandb=true"]))
    assert run.adopt_run(ws, main) == ["data", "model", "sft", "rl/shop_r1"]
    assert (ws.root / "data" / "rl_test.jsonl").read_text() == "t\n"
    assert (ws.root / "sft" / "hf" / "model.safetensors").read_text() == "w"
    assert (ws.root / "rl" / "shop_r1" / "grpo" / "hf" / "config.json").exists()
    assert (ws.root / "rl" / "shop_r1" / "rollouts.jsonl").read_text() == "r\n"
    sft = json.loads((ws.root / "sft" / "hf" / "done.json").read_text())
    assert (sft["steps"], sft["first_loss"], sft["last_loss"], sft["seconds"]) == (544, 7.5, 0.4, 1100.0)
    rl = json.loads((ws.root / "rl" / "shop_r1" / "done.json").read_text())
    assert (rl["steps"], rl["first_reward"], rl["last_reward"], rl["seconds"], rl["resumed"]) == (100, 300.0, 500.0,
                                                                                                 150.0, False)
    assert json.loads((ws.root / "stage_seconds.json").read_text()) == {"sft": 1100.0, "rl/shop_r1": 150.0}
    # The workspace's stages are now done: the continued-SFT plan reads the adopted times, nothing retrains.
    assert ws.sft(local=True) == str(ws.root / "sft" / "hf") and ws.rl(suites.SHOP_R1, local=True).endswith("hf")
    assert run.adopt_run(ws, main) == []  # a stage the workspace has is kept


def test_adopt_refuses_another_config_or_an_unfinished_run(tmp_path):
    ws = run.open_seed_workspace(_base(f"run_dir={tmp_path / 'scratch'}"), tmp_path, 31)
    other = tmp_path / "other"
    _fake_main_job(other, run.with_overrides(ws.cfg, [f"run_dir={other}", "seed=7", "data.synth_seed=7"]))
    with pytest.raises(ConfigError, match=r"data\.synth_seed: 31 -> 7|data\.synth_seed: 7 -> 31"):
        run.adopt_run(ws, other)
    half = tmp_path / "half"
    _fake_main_job(half, run.with_overrides(ws.cfg, [f"run_dir={half}"]))
    (half / "grpo" / "hf" / "config.json").unlink()
    with pytest.raises(ConfigError, match="missing .*grpo/hf/config.json"):
        run.adopt_run(ws, half)
    assert not (ws.root / "sft" / "hf" / "done.json").exists()  # refused before copying anything
    (half / "grpo" / "hf" / "config.json").write_text("{}")
    (half / "metrics_sft.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match=r"metrics_sft\.jsonl:1: not valid JSON"):
        run.adopt_run(ws, half)


def test_adopt_command_line():
    assert run.parse_adopt(["31=runs/a", "7=/x/b"], (7, 31)) == {31: Path("runs/a"), 7: Path("/x/b")}
    for bad, said in (("31", "SEED=RUN_DIR"), ("x=runs/a", "SEED=RUN_DIR"), ("5=runs/a", "not among --seeds")):
        with pytest.raises(ConfigError, match=said):
            run.parse_adopt([bad], (7, 31))
    with pytest.raises(SystemExit):
        run.main(["table2", "--adopt", "1=runs/a"])  # a v1 suite: refused before anything runs


# ---------------------------------------------------------------------------------------------- SFT continued


def test_continued_sft_steps_fill_the_rl_stage_time():
    # The main job's stage times: SFT 832 s over 163 steps (5.104 s a step), GRPO 134 s -> 134 / 5.104 = 26.25 -> 26.
    plan = run.continued_sft_plan(832.0, 163, 134.0)
    assert plan.steps == 26 and plan.seconds_per_step == pytest.approx(5.1043, abs=1e-4)
    assert run.continued_sft_plan(100.0, 10, 50.0).steps == 5  # exactly 5 steps of 10 s
    assert run.continued_sft_plan(100.0, 10, 3.0).steps == 1  # shorter than a step: still one
    with pytest.raises(ValueError, match="positive"):
        run.continued_sft_plan(0.0, 10, 50.0)


def test_continued_sft_stage_reads_the_stage_times_and_caps_sft(tmp_path, monkeypatch):
    import shop_r1.sft

    ws_root = tmp_path / "ws"
    for marker, info in (("data/stats.json", {}), ("sft/hf/done.json", {"steps": 163, "seconds": 900.0}),
                         ("rl/shop_r1/done.json", {"steps": 50, "seconds": 120.0, "resumed": False})):
        (ws_root / marker).parent.mkdir(parents=True, exist_ok=True)
        (ws_root / marker).write_text(json.dumps(info))
    (ws_root / "stage_seconds.json").write_text(json.dumps({"sft": 832.0, "rl/shop_r1": 134.0}))
    seen = {}

    def fake_sft(cfg, model_path, examples, out_dir, local):
        seen.update(max_steps=cfg.sft.max_steps, model=model_path, run_dir=cfg.run_dir)
        return SimpleNamespace(num_steps=cfg.sft.max_steps, first_loss=1.0, last_loss=0.5, seconds=130.0)

    monkeypatch.setattr(shop_r1.sft, "run_sft", fake_sft)
    ws = run.Workspace(_base(f"run_dir={ws_root}"), ws_root)
    assert ws.sft_continued(local=True) == str(ws_root / "sft_continued" / "hf")
    # The driver's stage times win over the markers' own seconds (832 / 163 s a step, 134 s of GRPO -> 26).
    assert seen == {"max_steps": 26, "model": str(ws_root / "sft" / "hf"), "run_dir": str(ws_root / "sft_continued")}
    done = json.loads((ws_root / "sft_continued" / "hf" / "done.json").read_text())
    assert done["steps"] == 26 and done["plan"]["rl_seconds"] == 134.0
    assert "sft_continued" in json.loads((ws_root / "stage_seconds.json").read_text())
    seen.clear()
    ws.sft_continued(local=True)  # done: never redone
    assert seen == {}


def test_rows_run_in_order_with_sft_continued_after_the_rl_rows():
    calls = []
    fake = SimpleNamespace(model=lambda row, local: calls.append(row.name) or row.name,
                           evaluate=lambda row, model, local: None)
    run._run_rows("t", suites.v2_suite("v2_table2", _base()).rows, fake, True)
    assert calls == ["zero_shot", "sft", "sft_rl_binary", "shop_r1", "sft_continued"]


@pytest.mark.parametrize("overrides, steps, epochs", [
    ((), 6, [0, 0, 0, 1, 1, 1]),                          # 2 epochs of ceil(5 / 2) = 3 steps
    (("sft.max_steps=7",), 7, [0, 0, 0, 1, 1, 1, 2]),     # past sft.epochs: a third pass, cut after one step
    (("sft.max_steps=2",), 2, [0, 0]),                    # inside the first epoch
])
def test_run_sft_max_steps(tmp_path, monkeypatch, overrides, steps, epochs):
    import shop_r1.data.examples
    import shop_r1.learner.sft_data
    import shop_r1.sft

    made = []

    class FakeGroup:
        def __init__(self, model_path, learner, lr, total_steps, seed, local, warmup_steps, lr_schedule="constant",
                     learner_cls=None):
            made.append((total_steps, warmup_steps))
            self.lr = lr

        def sft_step(self, per_rank, num_tokens):
            return [SimpleNamespace(loss=1.0, grad_norm=0.0, lr=self.lr, nonfinite="")]

        def save_hf(self, path):
            pass

        def save_checkpoint(self, path, state):
            made.append(state)

        def shutdown(self):
            pass

    seqs = tuple(SFTSequence(f"s{i}", (1, 2, 3), (0, 1, 1)) for i in range(5))
    monkeypatch.setitem(sys.modules, "transformers",
                        SimpleNamespace(AutoTokenizer=SimpleNamespace(from_pretrained=lambda p: SimpleNamespace(
                            pad_token_id=0))))
    monkeypatch.setattr(shop_r1.data.examples, "load_sft_examples", lambda path: [])
    monkeypatch.setattr(shop_r1.learner.sft_data, "tokenize_sft_examples", lambda ex, tok, n: TokenizedSFT(seqs, 0))
    monkeypatch.setattr(shop_r1.sft, "LearnerGroup", FakeGroup)
    cfg = load_config(None, [f"run_dir={tmp_path}", "sft.global_batch_size=2", "sft.epochs=2", "sft.warmup_ratio=0.2",
                             "logging.wandb=false", "logging.console_every=0", *overrides])
    result = shop_r1.sft.run_sft(cfg, "model", "x.jsonl", tmp_path / "sft", local=True)
    assert result.num_steps == steps
    assert made[0] == (steps, round(0.2 * steps))  # the schedule (warmup) spans the steps that run
    logged = [json.loads(line) for line in (tmp_path / "metrics_sft.jsonl").read_text().splitlines()]
    assert [r["sft/epoch"] for r in logged] == epochs


# ---------------------------------------------------------------------------------------------- summary over seeds

# Seed 0: SFT right on view + terminate (1/2), Shop-R1 always terminate (1/4).
# Seed 1: SFT right on view, add, terminate (3/4), Shop-R1 right everywhere (1).
SEED1_SFT = [_r(VIEW), _r(ADD), _r(T), _r(T)]
SEED1_SHOP = [_r(VIEW), _r(ADD), _r(CHECKOUT), _r(T)]
SUITE = suites.Suite((suites.SFT_ROW, suites.SFT_CONTINUED, suites.SHOP_R1), workspace="v2", notes=("a note",))


def _grpo_log(ws: Path) -> None:
    """Step 0 holds only val/* (rl.val_every > 0); step 1 is logged twice (a resumed run: the last one counts)."""
    train = {"reward/total": 1.0, "reward/format": 0.5, "reward/action_type": 0.2, "reward/attribute": 0.1,
             **{f"rollout/type_{k}": 0.25 for k in ("click", "type_and_submit", "terminate", "invalid")}}
    records = [{"step": 0, "val/exact": 0.1, "val/pred_terminate": 0.5}, {"step": 1, **train, "reward/total": 9.0},
               {"step": 1, **train}, {"step": 2, **train, "val/exact": 0.3, "val/pred_terminate": 0.4}]
    (ws / "rl" / "shop_r1").mkdir(parents=True)
    (ws / "rl" / "shop_r1" / "metrics_grpo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _seed_workspaces(tmp_path: Path) -> dict[int, Path]:
    out = {}
    for k, (sft, shop) in enumerate(((SFT_RESPONSES, SHOP_R1_RESPONSES), (SEED1_SFT, SEED1_SHOP))):
        ws = suites.seed_workspace(tmp_path / "root", k)
        _data(ws / "data")
        _write_eval(ws / "eval" / "sft", "SFT", sft)
        _write_eval(ws / "eval" / "sft_continued", "SFT continued", sft)
        _write_eval(ws / "eval" / "shop_r1", "SFT + Shop-R1", shop)
        (ws / "stage_seconds.json").write_text(json.dumps({"sft": 832.0, "rl/shop_r1": 134.0}))
        (ws / "sft_continued" / "hf").mkdir(parents=True)
        (ws / "sft_continued" / "hf" / "done.json").write_text(json.dumps(
            {"steps": 26, "plan": {"rl_seconds": 134.0, "seconds_per_step": 5.1043}}))
        _grpo_log(ws)
        out[k] = ws
    out[2] = suites.seed_workspace(tmp_path / "root", 2)  # not started: listed, not averaged
    return out


def test_rl_log_keeps_the_last_record_of_each_step(tmp_path):
    _grpo_log(tmp_path)
    log = summarize._rl_log(tmp_path, "shop_r1")
    assert [r["step"] for r in log] == [0, 1, 2] and log[1]["reward/total"] == 1.0


def test_summarize_seeds_mean_sd_paired_predictions_and_plots(tmp_path, monkeypatch):
    monkeypatch.setattr(summarize, "_machine_name", lambda: "box")
    out = summarize.summarize_seeds("v2_table2", SUITE, _seed_workspaces(tmp_path), tmp_path / "results")
    saved = json.loads((out / "results.json").read_text())
    shop, sft = saved["aggregate"]["shop_r1"]["summary"], saved["aggregate"]["sft"]["summary"]
    # Two seeds: the sample SD of {a, b} is |a - b| / sqrt(2).
    assert shop["exact_match"] == pytest.approx({"mean": 0.625, "sd": 0.75 / SQRT2, "n": 2})
    assert sft["exact_match"] == pytest.approx({"mean": 0.625, "sd": 0.25 / SQRT2, "n": 2})
    assert shop["predicted_terminate"] == pytest.approx({"mean": 0.625, "sd": 0.75 / SQRT2, "n": 2})
    assert shop["exact_match_non_terminate"] == pytest.approx({"mean": 0.5, "sd": 1 / SQRT2, "n": 2})  # 0/3, 3/3
    # kappa: Shop-R1 0 (constant) and 1 (perfect); SFT 0.2 (p_o 1/2, p_e 3/8) and 0.5 (p_o 3/4, p_e 8/16).
    assert shop["type_kappa"]["mean"] == pytest.approx(0.5) and sft["type_kappa"]["mean"] == pytest.approx(0.35)
    assert shop["minus_sft"] == pytest.approx({"mean": 0.0, "sd": 0.5 / SQRT2, "n": 2})  # -0.25, +0.25
    always = saved["aggregate"]["always_terminate"]
    assert always["kind"] == "baseline" and always["summary"]["exact_match"] == pytest.approx(
        {"mean": 0.25, "sd": 0.0, "n": 2})
    pair = saved["paired"]["1"]
    best = pair["best_baseline_exact"]
    assert pair["shop_r1_minus_best_baseline"]["value"] == pytest.approx(1.0 - best)
    assert pair["shop_r1_minus_sft"]["value"] == pytest.approx(0.25)
    # SFT continued answers as SFT here: Shop-R1 − SFT continued is Shop-R1 − SFT, paired alike
    assert pair["shop_r1_minus_sft_continued"] == pytest.approx(pair["shop_r1_minus_sft"])
    assert saved["paired"]["0"]["shop_r1_minus_sft_continued"]["value"] == pytest.approx(-0.25)
    assert saved["per_seed"]["2"]["not_run"] == ["SFT", "SFT continued (RL's wall time)", "SFT + Shop-R1"]
    assert saved["oracle_exact"] == {"0": None, "1": None, "2": None}  # no config.yaml: no profile known
    table = (out / "table.md").read_text()
    assert "| SFT + Shop-R1 | 62.50 ± 53.03 | +0.500 ± 0.707 |" in table
    assert "*Always terminate* (baseline)" in table and "s0: 25.00 [" in table and "## Seed 1" in table
    assert "SFT continued: 26 more SFT steps = floor(134 s" in table and "- a note" in table
    assert "not run yet, seed 2" in table and "| mean ± SD | +0.00 ± 35.36 | +0.00 ± 35.36 |" in table
    for k in (0, 1):
        assert sorted(p.name for p in (out / "predictions" / str(k)).iterdir()) == [
            "always_terminate.jsonl.gz", "majority_type.jsonl.gz", "sft.jsonl.gz", "sft_continued.jsonl.gz",
            "shop_r1.jsonl.gz", "visible_rule.jsonl.gz"]
    for png in ("exact_vs_terminate.png", "reward_seed0.png", "action_mix_seed1.png", "validation_seed0.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC, png
    everything = summarize.plot_all(tmp_path / "results" / "box")  # v2 results.json: points from every seed
    assert everything is not None and everything.read_bytes()[:8] == PNG_MAGIC


def test_tables_print_the_headroom_of_the_rows_that_drew_samples(tmp_path, monkeypatch):
    """Seed 0's SFT and Shop-R1 evaluations drew samples (headroom.json), seed 1's did not: seed 0's section has
    the headroom block (pass@1, sample exact, pass@k per target type, the "little to sharpen" note where pass@k is
    within 5 points of pass@1), seed 1's has none; `headroom_lines` is also what the single-workspace table calls."""
    from shop_r1.headroom import Headroom, HeadroomRow

    monkeypatch.setattr(summarize, "_machine_name", lambda: "box")
    wss = _seed_workspaces(tmp_path)
    row = {"click": HeadroomRow(2, 0.5, 0.25, 1.0), "terminate": HeadroomRow(2, 0.5, 0.5, 0.5)}
    for name, at_k in (("sft", 1.0), ("shop_r1", 0.52)):
        h = Headroom(8, 0.6, HeadroomRow(4, 0.5, 0.375, at_k), row)
        (wss[0] / "eval" / name / "headroom.json").write_text(json.dumps(h.to_dict()))
    table = (summarize.summarize_seeds("v2_table2", SUITE, wss, tmp_path / "results") / "table.md").read_text()
    seed0, seed1 = table.split("## Seed 0")[1].split("## Seed 1")
    assert "pass@8 %" in seed0 and "pass@8 %" not in seed1
    block = seed0.split("```")[1].splitlines()
    sft = next(ln.split() for ln in block if ln.startswith("SFT ") and "Shop-R1" not in ln)
    assert sft[1:5] == ["4", "50.0", "37.5", "100.0"]  # n, pass@1, sample exact, pass@8
    assert "sharpen" in seed0  # Shop-R1's pass@8 (52 %) is within 5 points of its pass@1 (50 %)
    assert summarize.headroom_lines(wss[1], SUITE.rows) == []
    assert summarize.headroom_lines(wss[0], SUITE.rows)[0] == "```"


def test_fig2_over_seeds_plots_the_temperatures(tmp_path, monkeypatch):
    monkeypatch.setattr(summarize, "_machine_name", lambda: "box")
    wss = _seed_workspaces(tmp_path)
    save_config(_base("rollout.temperature=0.6", "data.persona=false", "data.synth_version=3"),
                wss[0] / "config.yaml")  # no profile
    out = summarize.summarize_seeds("v2_fig2", suites.v2_suite("v2_fig2", _base("rollout.temperature=0.6")), wss,
                                    tmp_path / "results")
    assert (out / "temperature.png").read_bytes()[:8] == PNG_MAGIC
    table = (out / "table.md").read_text()
    assert "Shop-R1, T=0.6" in table and "Synthetic shop version 3 (`data.synth_version`)." in table


def test_each_rl_variant_is_paired_with_the_shop_r1_run_of_its_seed(tmp_path, monkeypatch):
    monkeypatch.setattr(summarize, "_machine_name", lambda: "box")
    variant = suites.Row("no_format_reward", "w/o format reward", ("reward.format_reward=false",))
    suite = suites.Suite((suites.SFT_ROW, variant, suites.SHOP_R1), workspace="v2")
    wss = _seed_workspaces(tmp_path)
    # The variant answers as SFT: seed 0 2/4 against Shop-R1's 1/4 (+25 points), seed 1 3/4 against 4/4 (-25).
    _write_eval(wss[0] / "eval" / "no_format_reward", "w/o format reward", SFT_RESPONSES)
    _write_eval(wss[1] / "eval" / "no_format_reward", "w/o format reward", SEED1_SFT)
    out = summarize.summarize_seeds("v2_table4", suite, wss, tmp_path / "results")
    saved = json.loads((out / "results.json").read_text())["minus_shop_r1"]
    assert saved["0"]["no_format_reward"]["value"] == pytest.approx(0.25)
    assert saved["1"]["no_format_reward"]["value"] == pytest.approx(-0.25)
    assert "2" not in saved  # seed 2 has no evaluated row: nothing paired
    table = (out / "table.md").read_text()
    # mean 0, SD 0.5 / sqrt(2); the paper's w/o format reward is 2.87 - 27.72 = -24.85 points
    assert "| +0.00 ± 35.36 |" in table and "| -24.85 |" in table
    assert "Each RL variant against the Shop-R1 run" in table
    # SFT and Shop-R1 are not variants of the Shop-R1 run
    assert set(saved["0"]) == {"no_format_reward"}


def test_direction_of_a_difference_reads_its_whole_interval():
    assert summarize.direction({"value": -0.05, "low": -0.09, "high": -0.01}) == "below"
    assert summarize.direction({"value": 0.05, "low": 0.01, "high": 0.09}) == "above"
    assert summarize.direction({"value": -0.05, "low": -0.09, "high": 0.0}) == "level"


def test_oracle_ceiling_of_a_profiled_workspace(tmp_path):
    from shop_r1.data.synth import synthesize_sessions
    from shop_r1.data.synth.policy import oracle_exact

    ws = tmp_path / "ws"
    sessions = synthesize_sessions(6, 0, 2, 0.0)  # no noise: the policy is every step
    examples = build_rl_examples(sessions, "latest_step", 10 ** 6, lambda msgs: 0, persona=True).examples
    (ws / "data").mkdir(parents=True)
    write_examples_jsonl(examples, ws / "data" / "rl_test.jsonl")
    assert summarize.oracle(ws) is None  # no config: not known to be the profiled shop
    save_config(load_config(None, ["data.synth_version=2", "data.persona=true"]), ws / "config.yaml")
    assert summarize.oracle(ws) == oracle_exact(load_rl_examples(ws / "data" / "rl_test.jsonl")) == 1.0
    save_config(load_config(None, ["data.synth_version=2", "data.persona=false"]), ws / "config.yaml")
    assert summarize.oracle(ws) is None


def test_a_table_grows_by_seeds_carried_from_an_earlier_summary(tmp_path, monkeypatch):
    """Seed 0 summarized on one machine, seed 1 run on another with --carry: the same table as both summarized
    together (intervals included: the carried seed's comparison is recomputed from its committed predictions)."""
    import gzip

    monkeypatch.setattr(summarize, "_machine_name", lambda: "box")
    wss = _seed_workspaces(tmp_path)
    both = summarize.summarize_seeds("v2_table2", SUITE, {0: wss[0], 1: wss[1]}, tmp_path / "both")
    first = summarize.summarize_seeds("v2_table2", SUITE, {0: wss[0], 2: wss[2]}, tmp_path / "first")
    (wss[0] / "rl").rename(tmp_path / "gone")  # the first machine's workspace is not here
    (wss[0] / "eval").rename(tmp_path / "gone_eval")
    saved = json.loads((first / "results.json").read_text())
    saved["per_seed"]["0"]["results"]["shop_r1"]["rl"] = {"steps": 7}  # the GRPO run's record travels
    saved["per_seed"]["0"]["results"]["sft"]["intervals"] = "stale"  # the rest is made again
    saved["machine"] = "a 2-core machine elsewhere"
    (first / "results.json").write_text(json.dumps(saved))
    # Seed 0's workspace here has no table (and seed 1 no carried one): seed 0 comes from the earlier summary.
    grown = summarize.summarize_seeds("v2_table2", SUITE, {0: wss[0], 1: wss[1]}, tmp_path / "grown",
                                      carry_from=first)
    a, b = json.loads((both / "results.json").read_text()), json.loads((grown / "results.json").read_text())
    assert b["seeds"] == [0, 1] and "carried_from" not in b["per_seed"]["1"]
    assert b["aggregate"] == a["aggregate"] and b["paired"] == a["paired"] and b["minus_shop_r1"] == a["minus_shop_r1"]
    rec = b["per_seed"]["0"]
    assert rec["comparison"] == a["per_seed"]["0"]["comparison"] and rec["not_run"] == []
    assert rec["results"]["sft"] == a["per_seed"]["0"]["results"]["sft"]
    assert rec["results"]["shop_r1"]["rl"] == {"steps": 7}
    assert rec["stage_seconds"] == {"sft": 832.0, "rl/shop_r1": 134.0}
    assert (rec["machine"], rec["carried_from"]) == ("a 2-core machine elsewhere", str(first))
    assert "2" not in b["per_seed"]  # seed 2 had no table to carry
    assert (grown / "reward_seed0.png").read_bytes() == (first / "reward_seed0.png").read_bytes()
    for name in ("sft", "shop_r1", "visible_rule"):
        assert gzip.decompress((grown / "predictions" / "0" / f"{name}.jsonl.gz").read_bytes()) == \
            gzip.decompress((first / "predictions" / "0" / f"{name}.jsonl.gz").read_bytes())
    table = (grown / "table.md").read_text()
    assert "seed 0 carried from an earlier run of this suite (its committed predictions re-read; it ran on a " \
           "2-core machine elsewhere)" in table and "## Seed 0" in table and "## Seed 1" in table
    # Carried again into its own folder: the same table, the first machine and folder kept.
    again = summarize.summarize_seeds("v2_table2", SUITE, {1: wss[1]}, tmp_path / "grown", carry_from=grown)
    c = json.loads((again / "results.json").read_text())
    assert c["aggregate"] == a["aggregate"] and c["per_seed"]["0"]["carried_from"] == str(first)
    # A seed with a table here replaces the carried one; another suite's table, a row the suite does not define,
    # and altered or missing predictions are refused, naming the file.
    assert summarize.carried_seeds(first, "v2_table2", SUITE.rows, exclude=(0,)) == {}
    with pytest.raises(ValueError, match="a 'v2_table2' table, not 'v2_table4'"):
        summarize.carried_seeds(first, "v2_table4", SUITE.rows)
    renamed = tuple(suites.Row(r.name, "Shop-R1 (other)", r.rl_overrides) if r.name == "shop_r1" else r
                    for r in SUITE.rows)
    with pytest.raises(ValueError, match="row 'shop_r1' .* is not a row of v2_table2 as defined now"):
        summarize.carried_seeds(first, "v2_table2", renamed)
    sft = first / "predictions" / "0" / "sft.jsonl.gz"
    lines = gzip.decompress(sft.read_bytes()).decode().splitlines(keepends=True)
    wrong = [json.loads(line) for line in lines]
    # One answer changed to another type, right or wrong alike (kappa and the mix move even if exact would not).
    wrong[0]["response"] = json.dumps({"rationale": "r", "action": {"type": "terminate"}}) \
        if json.loads(wrong[0]["response"])["action"]["type"] != "terminate" else \
        json.dumps({"rationale": "r", "action": {"type": "click", "name": "x"}})
    sft.write_bytes(gzip.compress("".join(json.dumps(w) + "\n" for w in wrong).encode()))
    with pytest.raises(ValueError, match=r"sft\.jsonl\.gz: metrics recomputed from the predictions differ .*"
                                         r"predicted_mix"):
        summarize.carried_seeds(first, "v2_table2", SUITE.rows)
    sft.unlink()
    with pytest.raises(FileNotFoundError, match=r"sft\.jsonl\.gz: seed 0's row 'SFT' has no predictions"):
        summarize.carried_seeds(first, "v2_table2", SUITE.rows)


def test_summarize_and_run_do_not_import_each_other():
    """check_carry and its helpers live in experiments/same_config.py, which both import (summarize imported
    experiments.run inside its main: a cycle)."""
    import ast

    tree = ast.parse(Path(summarize.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "experiments.run" not in imported and "experiments.same_config" in imported
    assert run.check_carry is summarize.check_carry


def test_carry_refuses_a_table_made_with_another_config(tmp_path):
    base = _base(f"run_dir={tmp_path / 'scratch'}")
    results = tmp_path / "results"
    results.mkdir()
    with pytest.raises(ConfigError, match="no config.yaml there"):
        run.check_carry(results, base, tmp_path)
    save_config(run.with_overrides(base, run.seed_overrides(tmp_path / "elsewhere", 7)), results / "config.yaml")
    run.check_carry(results, base, tmp_path)  # its own seed and workspace: the same experiment
    with pytest.raises(ConfigError, match=r"made with another config \(rl\.steps: 500 -> 7\)"):
        run.check_carry(results, _base(f"run_dir={tmp_path / 'scratch'}", "rl.steps=7"), tmp_path)
    args = run.parser().parse_intermixed_args(["v2_table4", "--seeds", "137", "--carry", str(results)])
    assert (args.seeds, args.carry) == ([137], str(results))
    with pytest.raises(SystemExit):
        run.main(["table4", "--carry", str(results)])  # the paper-setting suites have one workspace, no seeds
