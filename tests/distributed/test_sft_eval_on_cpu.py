"""SFT with the DeepSpeed learner group as a Ray actor lowers the loss; the saved folder loads in vLLM and
`evaluate` writes predictions, metrics and a table."""

import json

import pytest

from shop_r1.config import Config, load_config
from shop_r1.data.build import build_datasets
from shop_r1.data.sessions import write_sessions
from shop_r1.data.synth import synthesize_sessions
from shop_r1.evaluate import evaluate
from shop_r1.sft import run_sft


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("run")
    cfg: Config = load_config(None, [
        f"run_dir={root}", "data.max_prompt_tokens=1500", "data.test_fraction=0.25", "sft.epochs=4", "sft.lr=3e-3",
        "sft.global_batch_size=4", "sft.max_seq_len=3000", "learner.zero_stage=2", "logging.wandb=false",
        "eval.max_examples=6", "eval.max_new_tokens=24", "rollout.kv_cache_gib=1", "reward_pool.num_workers=1"])
    write_sessions(synthesize_sessions(10, seed=4), root / "sessions.jsonl")
    built = build_datasets(root / "sessions.jsonl", root / "data", tiny_model_dir, cfg.data, seed=0)
    return cfg, built, root


def test_sft_lowers_loss_and_eval_writes_its_files(ray_local_cluster, setup, tiny_model_dir):
    cfg, built, root = setup
    result = run_sft(cfg, str(tiny_model_dir), built.sft_train_path, root / "sft", local=False)
    assert result.num_steps == 8  # 7-8 train sessions / batch 4 = 2 steps per epoch, 4 epochs
    assert result.last_loss < result.first_loss - 0.3, (result.first_loss, result.last_loss)
    logged = [json.loads(line) for line in (root / "metrics_sft.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(1, 9)) and all("sft/loss" in r for r in logged)

    report = evaluate(cfg, result.hf_dir, built.rl_test_path, root / "eval", "SFT", local=False)  # vLLM loads it
    metrics = json.loads((root / "eval" / "metrics.json").read_text())
    assert metrics["n"] == report.metrics.n == min(6, built.rl_test.num_examples)
    assert {"exact_match", "type_accuracy", "type_macro_f1", "per_type", "reward/total"} <= set(metrics)
    preds = (root / "eval" / "predictions.jsonl").read_text().splitlines()
    assert len(preds) == report.metrics.n and "response" in json.loads(preds[0])
    assert "action type" in (root / "eval" / "metrics.txt").read_text()
