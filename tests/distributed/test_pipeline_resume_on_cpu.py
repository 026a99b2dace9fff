"""`shop-r1 pipeline` SIGKILLed during SFT (the driver, Ray and every worker at once), then run again with the same
command: the finished stages are skipped, SFT continues from its checkpoint, the run goes on to its table, and its SFT
model and SFT evaluation equal an uninterrupted run's on the same seed to the byte.

The uninterrupted run stops after the SFT eval (`--until sft-eval`): the stages after it read only the SFT model,
whose bytes are compared, and their own resume is `test_grpo_on_cpu`'s (about a third of this test's time saved)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = ["data.synth_num_sessions=24", "data.val_fraction=0", "sft.epochs=3", "sft.max_steps=12",
             "eval.zero_shot=false", "sft.global_batch_size=4", "sft.checkpoint_every=2", "sft.max_seq_len=2400",
             "rl.steps=2", "rl.global_batch_size=8",
             "rollout.group_size=4", "rl.val_every=0", "eval.max_examples=8", "rollout.max_new_tokens=32",
             "eval.max_new_tokens=32", "logging.wandb=false", "rollout.kv_cache_gib=1", "ray.num_cpus=4",
             "rollout.num_cpus_per_engine=1", "learner.num_cpus_per_rank=1", "logging.console_every=0"]


def _command(run_dir: Path, *flags: str) -> list[str]:
    return [str(Path(sys.executable).parent / "shop-r1"), "pipeline", *flags, "--config",
            str(REPO / "configs" / "demo_cpu.yaml"), f"run_dir={run_dir}", *OVERRIDES]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"DS_ACCELERATOR": "cpu", "WANDB_MODE": "disabled", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    env.pop("RAY_ADDRESS", None)
    return env


def _run(run_dir: Path, log: Path, *flags: str) -> str:
    with log.open("w") as f:
        proc = subprocess.run(_command(run_dir, *flags), cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                              timeout=900, start_new_session=True)
    out = log.read_text()
    assert proc.returncode == 0, out[-4000:]
    return out


def _sft_steps(run_dir: Path) -> int:
    path = run_dir / "metrics_sft.jsonl"
    if not path.exists():
        return 0
    return max((json.loads(x)["step"] for x in path.read_text().splitlines() if x.endswith("}")), default=0)


def _table(run_dir: Path) -> dict:
    rows = json.loads((run_dir / "results.json").read_text())["comparison"]["rows"]
    return {r["label"]: r["metrics"] for r in rows}


def _sft_eval(run_dir: Path) -> dict:
    metrics = json.loads((run_dir / "eval" / "sft" / "metrics.json").read_text())
    metrics.pop("seconds")  # the eval's wall time, the one field that differs between two runs
    return metrics


def _sft_model_bytes(run_dir: Path) -> dict[str, bytes]:
    hf = run_dir / "sft" / "hf"
    return {p.name: p.read_bytes() for p in sorted(hf.iterdir()) if p.suffix == ".safetensors"}


@pytest.mark.slow
@pytest.mark.first
@pytest.mark.timeout(2400)
def test_pipeline_killed_during_sft_resumes_and_ends_as_an_uninterrupted_run(tmp_path):
    killed = tmp_path / "killed"
    with (tmp_path / "first.log").open("w") as f:
        proc = subprocess.Popen(_command(killed), cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while _sft_steps(killed) < 3:  # past the first SFT checkpoint (step 2)
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "SFT never reached step 3"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its GCS and raylet at once (the workers then exit)
        proc.wait()
    ledger = json.loads((killed / "stages.json").read_text())
    assert ledger["SFT"]["status"] == "started" and ledger["examples"]["status"] == "done"

    out = _run(killed, tmp_path / "second.log")
    for stage in ("model", "sessions", "examples"):
        assert f"  {stage}: finished before with this config and these inputs; skipped" in out, stage
    assert "  SFT: started before with this config and these inputs; continuing from its checkpoints" in out
    assert "SFT resumed from" in out
    logged = [json.loads(x)["step"] for x in (killed / "metrics_sft.jsonl").read_text().splitlines() if x]
    assert sorted(set(logged)) == list(range(1, max(logged) + 1))  # every step logged (some twice: the last counts)

    assert {"SFT", "Shop-R1"} <= set(_table(killed))  # the resumed run went on to the end

    whole = tmp_path / "whole"
    out = _run(whole, tmp_path / "whole.log", "--until", "sft-eval")
    assert "stopped after SFT eval (--until sft-eval)" in out and not (whole / "grpo").exists()
    assert _sft_model_bytes(killed) == _sft_model_bytes(whole) and _sft_model_bytes(whole)
    assert _sft_eval(killed) == _sft_eval(whole)
    ledger = json.loads((whole / "stages.json").read_text())
    assert ledger["SFT eval"]["status"] == "done" and "GRPO" not in ledger
