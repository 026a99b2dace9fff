"""`shop-r1 pipeline --until STAGE` stops after that stage, before Ray for the data stages, and records in the stage
ledger what it finished, so the same command without --until continues from there."""

import json
from pathlib import Path

import pytest

from shop_r1.cli import main
from shop_r1.config import ConfigError, load_config
from shop_r1.pipeline import UNTIL_STAGES, run_pipeline

DEMO = str(Path(__file__).resolve().parents[1] / "configs" / "demo_cpu.yaml")


def test_until_examples_builds_the_data_and_starts_no_ray(tmp_path, capsys, monkeypatch):
    import shop_r1.distributed.runtime as runtime

    monkeypatch.setattr(runtime, "start_ray", lambda *a, **k: pytest.fail("--until examples started Ray"))
    cfg = load_config(DEMO, [f"run_dir={tmp_path}", "data.synth_num_sessions=12", "data.val_fraction=0",
                             "rl.val_every=0",
                             "logging.wandb=false"])
    result = run_pipeline(cfg, until="examples")
    assert result.stopped_after == "examples" and result.sft_model_dir is None and result.table is None
    assert "stopped after examples (--until examples)" in capsys.readouterr().out
    ledger = json.loads((tmp_path / "stages.json").read_text())
    assert [ledger[s]["status"] for s in ("model", "sessions", "examples")] == ["done"] * 3
    assert "SFT" not in ledger and not (tmp_path / "results.json").exists()
    assert (tmp_path / "data" / "rl_train.jsonl").stat().st_size > 0


def test_an_unknown_until_is_a_config_error_naming_the_stages(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--until 'rl': not a stage; one of examples, sft, sft-eval, grpo"):
        run_pipeline(load_config(DEMO, [f"run_dir={tmp_path}"]), until="rl")
    assert not (tmp_path / "stages.json").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["pipeline", "--until", "rl", "--config", DEMO])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "argument --until: invalid choice: 'rl' (choose from 'examples', 'sft', 'sft-eval', 'grpo')" in err
    assert list(UNTIL_STAGES) == ["examples", "sft", "sft-eval", "grpo"]
