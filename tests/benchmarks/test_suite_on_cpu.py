"""The benchmark suite's runner: its summary and plots from hand-made results, and a real quick run of two
benchmarks (ROUGE-L against rouge-score, the reward pool through Ray) into a results folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import run_suite  # noqa: E402

RESULTS = {
    "rouge": {"shop_r1_pairs_per_s": 30000.0, "rouge_score_pairs_per_s": 10000.0, "speedup": 3.0},
    "reward_pool": {"direct_responses_per_s": 1000.0, "pool1_over_direct": 0.8,
                    "pool": [{"actors": 1, "responses_per_s": 800.0, "scaling_vs_1_actor": 1.0},
                             {"actors": 2, "responses_per_s": 1400.0, "scaling_vs_1_actor": 1.75}]},
    "trl_tiny": {"prompts_per_step": 2, "n": 4, "max_new_tokens": 48, "max_prompt_tokens": 1200,
                 "samples_per_s_ratio": 2.5, "generated_tokens_per_s_ratio": 2.0,
                 "trl": {"samples_per_s": 1.0, "generated_tokens_per_s": 40.0, "step_s": 8.0, "setup_s": 5.0,
                         "share": {"generate": 0.7, "reward": 0.01, "rest": 0.29}},
                 "shop_r1": {"samples_per_s": 2.5, "generated_tokens_per_s": 80.0, "step_s": 3.2, "setup_s": 30.0,
                             "share": {"rollout": 0.5, "reward": 0.05, "update": 0.4, "weight_sync": 0.03,
                                       "other": 0.02}}},
}


def test_summary_rows_are_the_measured_ratios():
    rows = {r[0]: r for r in run_suite.summary_rows(RESULTS)}
    assert rows["ROUGE-L (reward)"][3] == "3.00x"
    assert rows["Reward pool, 2 actors"][1:] == ("1,400 responses/s", "1 actor 800 responses/s", "1.75x")
    assert rows["GRPO vs TRL, tiny Qwen2: samples/s"][1:] == ("2.500", "TRL 1.000", "2.50x")
    assert "rollout" not in " ".join(rows).lower()  # only what was run


def test_summary_and_plots_are_written(tmp_path):
    info = {"name": "cpu-test", "cpu_model": "Test CPU", "cpu_cores": 2, "cpu_isa": "avx2", "ram_gib": 24.0,
            "torch": "2.13.0", "vllm": "0.32.0", "deepspeed": "0.19.8", "ray": "2.60.0", "transformers": "5.19.0",
            "trl": "1.16.0"}
    plots = run_suite.write_plots(tmp_path, RESULTS)
    assert plots == ["ratios.png", "step_split.png", "reward_pool_scaling.png"]
    for p in plots:
        assert (tmp_path / p).read_bytes()[:4] == b"\x89PNG"
    run_suite.write_summary(tmp_path, info, RESULTS, {"rouge": 3.0}, plots)
    md = (tmp_path / "README.md").read_text()
    assert "| GRPO vs TRL, tiny Qwen2: gen. tokens/s | 80.0 | TRL 40.0 | 2.00x |" in md
    assert "TRL 8.0 s/step = generate 70%, reward 1%, rest 29%" in md and "![ratios.png](ratios.png)" in md


@pytest.mark.timeout(600)
def test_quick_suite_run_writes_results(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(BENCH / "run_suite.py"), "--quick", "--only", "rouge,reward_pool",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert set(data["results"]) == {"rouge", "reward_pool"} and data["quick"] is True
    assert data["results"]["rouge"]["mismatches"] == 0
    assert [p["actors"] for p in data["results"]["reward_pool"]["pool"]] == [1, 2]
    assert json.loads((out / "machine.json").read_text())["name"].startswith(("cpu-", "cuda-"))
    assert "| ROUGE-L (reward) |" in (out / "README.md").read_text()
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([sys.executable, str(BENCH / "run_suite.py"), "--only", "nope", "--out", str(out)],
                       check=True, capture_output=True)
