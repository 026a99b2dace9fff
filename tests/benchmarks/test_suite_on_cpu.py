"""The benchmark suite's runner: its summary and plots from hand-made results, the pure parts of the TRL race
(median and spread, per-side summaries, the side-by-side settings table) and of the async-vs-sync benchmark (timed
steps, per-side summaries, the ratio over repeats), and a real quick run of two benchmarks
(ROUGE-L against rouge-score, the reward pool through Ray) into a results folder; and the update_logits benchmark end
to end at the tiny shape, whose equality check refuses a ratio when the two sides' s(r) or advantages differ."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_async  # noqa: E402
import bench_trl  # noqa: E402
import bench_update_self_certainty  # noqa: E402
import common  # noqa: E402
import run_suite  # noqa: E402


def _step(step_s: float, tokens: int, stages: dict) -> dict:
    return {"step_s": step_s, "generated_tokens": tokens, "prompt_tokens": 2048, "stages": stages}


SETTINGS_TRL = {"threads (torch.get_num_threads)": 2, "dtype": "float32", "loss": "global token mean (loss_type=dapo)",
                "generation": "HF generate"}
SETTINGS_OURS = {"threads (torch.get_num_threads)": {"learner": 2, "engine": 2},
                 "dtype": {"learner": "float32", "engine": "float32"},
                 "loss": "global token mean (rl.loss=dapo)", "generation": "vLLM"}
# TRL: 8 samples per step in 8, 10 and 6 s; shop-r1 in 4, 2 and 3 s (medians 8 s and 3 s).
TRL = bench_trl.summarize("trl", [_step(8.0, 320, {"generate": 5.6, "reward": 0.08, "rest": 2.32}),
                                  _step(10.0, 320, {"generate": 7.0, "reward": 0.1, "rest": 2.9}),
                                  _step(6.0, 320, {"generate": 4.2, "reward": 0.06, "rest": 1.74})],
                          batch=8, setup_s=5.0, warmup_s=12.0, settings=SETTINGS_TRL)
OURS = bench_trl.summarize("shop_r1", [_step(4.0, 256, {"update": 1.6, "weight_sync": 0.4, "rollout": 2.0}),
                                       _step(2.0, 256, {"rollout": 1.0, "update": 0.8, "weight_sync": 0.2}),
                                       _step(3.0, 256, {"rollout": 1.5, "update": 1.2, "weight_sync": 0.3})],
                           batch=8, setup_s=30.0, warmup_s=6.0, settings=SETTINGS_OURS)
TRL["peak_rss_gib"], OURS["peak_rss_gib"] = 3.0, {"learner": 1.5, "engine": 0.8}
SCALING_ROW = {"prompt_tokens": 512, "n": 4, "trl_prompt_tokens_per_step": 512, "shop_r1_prompt_tokens_per_step": 512,
               "trl_step_s": 2.0, "shop_r1_step_s": 1.0, "trl_generated_tokens_per_s": 96.0,
               "shop_r1_generated_tokens_per_s": 192.0, "speedup": 2.0}
AT_1024 = {"prompt_tokens": 1024, "trl_prompt_tokens_per_step": 1024, "shop_r1_prompt_tokens_per_step": 1024}


def _grpo_row(step: int, step_s: float, lag: int, overlapped: bool) -> dict:
    row = {"step": step, "timing/step": step_s, "timing/rollout": step_s / 2, "timing/update": step_s / 4,
           "timing/weight_sync": 0.1, "rollout/policy_lag_max": lag}
    return {**row, "timing/rollout_overlapped": 1.5} if overlapped else row


# 6 steps of 8 samples each; timed: steps 3, 4, 5 (2 warm-up steps, the last drains). Sync 6, 4.5, 5 s (median 5);
# async 3, 2, 4 s (median 3) with a 1 s last step that must not count.
SYNC_ROWS = [_grpo_row(i, t, 0, False) for i, t in enumerate([9.0, 7.0, 6.0, 4.5, 5.0, 5.5], 1)]
ASYNC_ROWS = [_grpo_row(i, t, min(i - 1, 1), i > 1) for i, t in enumerate([9.0, 5.0, 3.0, 2.0, 4.0, 1.0], 1)]
SYNC, ASYNC = bench_async.summarize_side(0, SYNC_ROWS, 8), bench_async.summarize_side(1, ASYNC_ROWS, 8)
RESULTS = {
    "rouge": {"shop_r1_pairs_per_s": 30000.0, "rouge_score_pairs_per_s": 10000.0, "speedup": 3.0},
    "reward_pool": {"direct_responses_per_s": 1000.0, "pool1_over_direct": 0.8,
                    "pool": [{"actors": 1, "responses_per_s": 800.0, "scaling_vs_1_actor": 1.0},
                             {"actors": 2, "responses_per_s": 1400.0, "scaling_vs_1_actor": 1.75}]},
    "trl_tiny": {"prompts_per_step": 2, "n": 4, "max_new_tokens": 48, "max_prompt_tokens": 1400, "prompt_tokens": 1024,
                 "threads": 2, "warmup_steps": 1, "timed_steps": 3,
                 "settings": bench_trl.settings_rows(TRL["settings"], OURS["settings"]),
                 "samples_per_s_ratio": 8.0 / 3.0, "generated_tokens_per_s_ratio": (256 / 3) / 40.0,
                 "speedup": 8.0 / 3.0, "trl": TRL, "shop_r1": OURS},
    "async": {"model": "tiny", "steps": 6, "warmup_steps": 2, "timed_steps": 3, "prompts_per_step": 2, "n": 4,
              "max_new_tokens": 40, "prompt_tokens": 1024, "seed": 0, "threads": 2, "repeats": 1,
              **bench_async.compare([(SYNC, ASYNC)]), "runs": [{"sync": SYNC, "async": ASYNC}]},
    "trl_scaling": {"mode": "scaling", "model": "tiny", "prompts_per_step": 1, "max_new_tokens": 48, "threads": 2,
                    "warmup_steps": 1, "timed_steps": 2, "note": "2 timed step(s) after 1 warm-up per point",
                    "prompts": "fixed length", "fixed_n": 4, "fixed_prompt_tokens": 1024,
                    "by_prompt_tokens": [SCALING_ROW, {**SCALING_ROW, **AT_1024}],
                    "by_n": [{**SCALING_ROW, **AT_1024, "n": 8, "speedup": 2.5}]},
}


def test_spread_is_median_quartiles_and_range():
    # [1, 2, 3, 4, 5]: median 3; inclusive quartiles at positions 1 and 3 (0-based) of the sorted values: 2 and 4.
    assert common.spread([5, 1, 4, 2, 3]) == {"median": 3, "q1": 2, "q3": 4, "min": 1, "max": 5, "n": 5}
    # [1, 2, 3, 4]: positions 0.75, 1.5, 2.25 -> 1.75, 2.5, 3.25.
    assert common.spread([4, 3, 2, 1]) == {"median": 2.5, "q1": 1.75, "q3": 3.25, "min": 1, "max": 4, "n": 4}
    assert common.spread([7.0]) == {"median": 7.0, "q1": 7.0, "q3": 7.0, "min": 7.0, "max": 7.0, "n": 1}
    with pytest.raises(ValueError):
        common.spread([])


def test_summarize_reports_medians_spreads_and_stages():
    # Step times 8, 10, 6 s -> median 8; samples/s 8/8, 8/10, 8/6 -> median 1.0; tokens/s 40, 32, 53.3 -> 40.
    assert TRL["step_s"] == 8.0 and TRL["samples_per_s"] == 1.0 and TRL["generated_tokens_per_s"] == 40.0
    assert TRL["spread"]["step_s"]["min"] == 6.0 and TRL["spread"]["step_s"]["max"] == 10.0
    assert TRL["stage_s"] == {"generate": 5.6, "reward": 0.08, "rest": 2.32}  # each stage's median
    assert TRL["share"]["generate"] == pytest.approx((5.6 + 7.0 + 4.2) / 24.0)  # share of the summed step time
    assert TRL["settings"]["prompt tokens per step (median)"] == 2048 and TRL["timed_steps"] == 3
    assert list(OURS["stage_s"]) == ["rollout", "update", "weight_sync"]  # pipeline order
    with pytest.raises(ValueError, match="no timed step"):
        bench_trl.summarize("trl", [], batch=8, setup_s=0.0, warmup_s=0.0, settings={})


def test_async_timed_steps_skip_warmup_and_the_drain_and_count_a_rerun_once():
    rows = [{"step": s, "timing/step": float(s)} for s in (1, 2, 3, 4, 3, 5)]  # step 3 ran again after a restart
    assert [r["step"] for r in bench_async.timed_rows(rows)] == [3, 4]
    assert bench_async.timed_rows(rows)[0] is rows[4]  # the last occurrence is the one kept
    assert bench_async.timed_rows(rows[:3]) == []  # 3 steps: 2 warm-up + the last


def test_async_side_summary_and_ratio_over_repeats():
    assert SYNC["timed_steps"] == [3, 4, 5] and SYNC["step_s"] == 5.0 and SYNC["samples_per_s"] == 8 / 5
    assert SYNC["spread"]["step_s"]["min"] == 4.5 and SYNC["spread"]["step_s"]["max"] == 6.0
    assert SYNC["warmup_step_s"] == [9.0, 7.0] and SYNC["policy_lag_max"] == 0
    assert "rollout_overlapped" not in SYNC["stage_s"]
    # Async 3, 2, 4 s: median 3 (the 1 s drain left out); samples/s 8/3, 4, 2 -> 8/3; rollout = step / 2.
    assert ASYNC["step_s"] == 3.0 and ASYNC["samples_per_s"] == 8 / 3 and ASYNC["policy_lag_max"] == 1
    assert ASYNC["stage_s"] == {"rollout": 1.5, "update": 0.75, "weight_sync": 0.1, "rollout_overlapped": 1.5}
    with pytest.raises(ValueError, match="no timed step"):
        bench_async.summarize_side(1, ASYNC_ROWS[:3], 8)
    # Two repeats, ratios 5/3 and 6/4 -> median 1.583; per side the median of the repeats' medians.
    faster = {**SYNC, "step_s": 6.0, "samples_per_s": 8 / 6}, {**ASYNC, "step_s": 4.0, "samples_per_s": 2.0}
    both = bench_async.compare([(SYNC, ASYNC), faster])
    assert both["ratios"] == [5 / 3, 1.5] and both["ratio_sync_over_async"] == pytest.approx((5 / 3 + 1.5) / 2)
    assert both["sync_step_s"] == 5.5 and both["async_step_s"] == 3.5 and both["async_samples_per_s"] == (8 / 3 + 2) / 2
    with pytest.raises(ValueError):
        bench_async.compare([])


def test_settings_rows_compare_values_per_actor_and_without_notes():
    rows = {r["setting"]: r for r in bench_trl.settings_rows(SETTINGS_TRL, SETTINGS_OURS)}
    assert rows["threads (torch.get_num_threads)"]["same"]  # 2 against learner 2, engine 2
    assert rows["loss"]["same"]  # the option names in parentheses are notes
    assert not rows["generation"]["same"] and rows["generation"]["kind"] == "by design"
    assert rows["KL beta"]["trl"] == "not reported" and rows["KL beta"]["same"] is None  # every setting has a row
    assert not bench_trl.settings_rows({"dtype": "float32"}, {"dtype": {"learner": "float32", "engine": "bfloat16"}}
                                       )[2]["same"]
    assert [r["setting"] for r in bench_trl.settings_rows({}, {})] == list(bench_trl.SETTINGS)


def test_settings_table_renders_side_by_side():
    lines = run_suite.settings_table(RESULTS["trl_tiny"]["settings"])
    assert lines[:2] == ["| setting | TRL | shop-r1 | |", "|---|---|---|---|"]
    assert "| threads (torch.get_num_threads) | 2 | learner 2, engine 2 | same |" in lines
    assert "| generation | HF generate | vLLM | by design |" in lines
    assert "| KL beta | not reported | not reported | not reported |" in lines
    assert "| prompt tokens per step (median) | 2,048 | 2,048 | same |" in lines  # medians are floats
    differs = run_suite.settings_table([{"setting": "dtype", "kind": "matched", "trl": "float32",
                                         "shop_r1": {"learner": "bfloat16"}, "same": False}])
    assert differs[-1] == "| dtype | float32 | learner bfloat16 | **differs** |"
    assert run_suite.setting_text(False) == "off" and run_suite.fmt(201.4) == "201" and run_suite.fmt(0.2) == "0.200"


def test_summary_rows_are_the_measured_ratios():
    rows = {r[0]: r for r in run_suite.summary_rows(RESULTS)}
    assert rows["ROUGE-L (reward)"][3] == "3.00x"
    assert rows["Reward pool, 2 actors"][1:] == ("1,400 responses/s", "1 actor 800 responses/s", "1.75x")
    assert rows["GRPO vs TRL, tiny Qwen2: samples/s"][1:] == ("2.667", "TRL 1.000", "2.67x")  # medians
    assert rows["GRPO step, one-step-off async vs sync"][1:] == ("3.00 s/step", "sync 5.00 s/step", "1.67x")
    assert "rollout" not in " ".join(rows).lower()  # only what was run


def test_summary_and_plots_are_written(tmp_path):
    info = {"name": "cpu-test", "cpu_model": "Test CPU", "cpu_cores": 2, "cpu_isa": "avx2", "ram_gib": 24.0,
            "torch": "2.13.0", "vllm": "0.32.0", "deepspeed": "0.19.8", "ray": "2.60.0", "transformers": "5.19.0",
            "trl": "1.16.0"}
    plots = run_suite.write_plots(tmp_path, RESULTS)
    assert plots == ["ratios.png", "step_split.png", "trl_scaling.png", "reward_pool_scaling.png"]
    for p in plots:
        assert (tmp_path / p).read_bytes()[:4] == b"\x89PNG"
    run_suite.write_summary(tmp_path, info, RESULTS, {"rouge": 3.0}, plots)
    md = (tmp_path / "README.md").read_text()
    assert "| GRPO vs TRL, tiny Qwen2: gen. tokens/s | 85.3 | TRL 40.0 | 2.13x |" in md
    assert "### GRPO vs TRL, tiny Qwen2 (`trl_tiny`)" in md and "every prompt cut to 1024 tokens" in md
    assert "| threads (torch.get_num_threads) | 2 | learner 2, engine 2 | same |" in md
    # TRL: step times 6, 8, 10 s -> 8.00 [6.00-10.0]; samples/s 0.8, 1.0, 1.33.
    assert ("| TRL | 8.00 [6.00-10.0] | 1.00 [0.800-1.33] | 40.0 [32.0-53.3] | generate 5.60, reward 0.080, "
            "rest 2.32 | 12.0 | 5.00 | 3.0 |") in md
    assert md.count("| learner 1.5, engine 0.8 |") == 1
    assert "| prompt length (n=4) | 512 | 4 | 2.00 | 1.00 | 2.00x | 96.0 | 192 |" in md
    assert "| group size (1024 tokens) | 1,024 | 8 | 2.00 | 1.00 | 2.50x | 96.0 | 192 |" in md
    # A cut that missed its length shows what each side measured.
    off = {**RESULTS["trl_scaling"], "by_n": [{**SCALING_ROW, "trl_prompt_tokens_per_step": 513.0}]}
    assert "| 512 (per step: TRL 513, shop-r1 512) | 4 |" in "\n".join(run_suite.scaling_lines(off))
    assert "### GRPO step, one-step-off async vs sync (`async`)" in md and "(median 1.67x)" in md
    assert ("| 1 | async | 3.00 [2.00-4.00] | 2.67 [2.00-4.00] | rollout 1.50, update 0.750, weight_sync 0.100, "
            "rollout_overlapped 1.50 | 1 |") in md
    assert "![ratios.png](ratios.png)" in md and "![trl_scaling.png](trl_scaling.png)" in md


@pytest.mark.timeout(600)
def test_quick_suite_run_writes_results(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(BENCH / "run_suite.py"), "--quick", "--only", "rouge,reward_pool",
                           "--out", str(out)], check=False, capture_output=True, text=True, timeout=600)
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


def test_repeated_race_alternates_sides_pairs_speedups_and_keeps_a_sides_error(monkeypatch, tmp_path):
    # TRL takes 8, 10, 6 s per repeat; shop-r1 2, 4, 3 s; shared prompts off 4, 5, 6 s; TRL's vLLM path fails.
    step = {"trl": [8.0, 10.0, 6.0], "shop_r1": [2.0, 4.0, 3.0], "shop_r1[shared_off]": [4.0, 5.0, 6.0]}
    calls = []

    def fake_child(args, timeout_s, env=None):
        side, variant = args[args.index("--side") + 1], args[args.index("--variant") + 1]
        name = f"{side}[{variant}]" if variant else side
        calls.append(name)
        if name == "trl[trl_vllm]":
            raise RuntimeError("benchmark failed (exit 1): vLLM colocate needs CUDA")
        k = sum(c == name for c in calls) - 1
        rss = 3.0 if side == "trl" else {"learner": 1.0, "engine": 0.5}
        return {"step_s": step[name][k], "samples_per_s": 8 / step[name][k], "prompt_tokens_per_step": 2048,
                "stage_s": {}, "peak_rss_gib": rss}

    monkeypatch.setattr(bench_trl, "run_child", fake_child)
    args = bench_trl.argparse.Namespace(model="tiny", prompts=2, n=4, steps=3, max_new_tokens=8,
                                        max_prompt_tokens=100, prompt_tokens=0, threads=2, repeats=3,
                                        variants="shared_off,trl_vllm", no_trl=False)
    out = bench_trl.race_repeated(args, str(tmp_path))
    # alternating: every side once per repeat, the failed side tried once only
    assert calls == ["trl", "trl[trl_vllm]", "shop_r1", "shop_r1[shared_off]"] + ["trl", "shop_r1",
                                                                                  "shop_r1[shared_off]"] * 2
    assert set(out["errors"]) == {"trl[trl_vllm]"} and "needs CUDA" in out["errors"]["trl[trl_vllm]"]
    assert out["sides"]["trl"]["step_s"]["median"] == 8.0 and out["sides"]["shop_r1"]["step_s"]["median"] == 3.0
    # paired by repeat: 8/2, 10/4, 6/3 -> 4, 2.5, 2 (median 2.5); 8/4, 10/5, 6/6 -> 2, 2, 1 (median 2)
    assert out["speedup_over_trl"]["shop_r1"]["median"] == 2.5
    assert out["speedup_over_trl"]["shop_r1[shared_off]"]["median"] == 2.0
    assert out["sides"]["shop_r1"]["peak_rss_gib"] == 1.5 and out["sides"]["trl"]["peak_rss_gib"] == 3.0
    # each variant against shop-r1, paired by repeat: 4/2, 5/4, 6/3 -> 2, 1.25, 2 (median 2)
    assert out["step_over_shop_r1"] == {"shop_r1[shared_off]": bench_trl.spread([2.0, 1.25, 2.0])}

    # --no-trl: shop-r1 and its variants only, still alternating; a TRL variant asked for is refused
    calls.clear()
    out = bench_trl.race_repeated(bench_trl.argparse.Namespace(**{**vars(args), "variants": "shared_off",
                                                                  "no_trl": True}), str(tmp_path))
    assert calls == ["shop_r1", "shop_r1[shared_off]"] * 3
    assert set(out["sides"]) == {"shop_r1", "shop_r1[shared_off]"} and out["speedup_over_trl"] == {}
    assert out["step_over_shop_r1"]["shop_r1[shared_off]"]["median"] == 2.0
    with pytest.raises(SystemExit, match="--no-trl"):
        bench_trl.race_repeated(bench_trl.argparse.Namespace(**{**vars(args), "no_trl": True}), str(tmp_path))


def test_repeated_race_refuses_an_unknown_variant(tmp_path):
    args = bench_trl.argparse.Namespace(variants="no_such", repeats=2)
    with pytest.raises(SystemExit, match="unknown --variants"):
        bench_trl.race_repeated(args, str(tmp_path))


# Tiny settings: 3 groups of 4 rows (40 prompt + 12 completion tokens), 0 or 1 group zero-signal, one repeat.
TINY_UPDATE_SC = ["--shape", "tiny", "--prompts", "3", "--group-size", "4", "--prompt-tokens", "40",
                  "--completion-tokens", "12", "--dropped-groups", "0,1", "--repeats", "1", "--threads", "1"]


@pytest.mark.timeout(120)
def test_update_self_certainty_bench_times_both_sides_of_each_configuration(tmp_path):
    out = tmp_path / "update_sc.json"
    proc = subprocess.run([sys.executable, str(BENCH / "bench_update_self_certainty.py"), *TINY_UPDATE_SC,
                           "--json-out", str(out)], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["benchmark"] == "update_self_certainty" and data["sides"] == ["today", "update"]
    assert data["threads"] == 1 and "lr=0" in data["same_weights"]
    rows = data["results"]
    assert [(r["dropped_groups"], r["self_certainty_breaks_ties"]) for r in rows] == [(0, False), (0, True),
                                                                                     (1, False), (1, True)]
    for r in rows:
        assert r["rows"] == 12 and r["zero_signal_groups"] == r["dropped_groups"]
        assert r["kept_rows"] == 12 - 4 * r["dropped_groups"]  # the dropped group's 4 rows train nothing
        for side in ("today", "update"):
            assert r[side]["step_s"]["n"] == 1 and r[side]["step_s"]["median"] > 0 and r[side]["warmup_s"] > 0
        assert r["ratio_today_over_update"] > 0
        assert r["ratio_today_over_update"] == r["today"]["step_s"]["median"] / r["update"]["step_s"]["median"]
        assert r["max_abs_diff"]["self_certainty"] <= 1e-5 and r["max_abs_diff"]["advantages"] <= 1e-5
    # today: every row without gradient, the kept rows with; update: the dropped rows without gradient where they
    # are known before s(r) (rl.self_certainty_breaks_ties=false), else every row with gradient.
    assert rows[2]["rows_forwarded"] == {"today": {"no_grad": 12, "grad": 8}, "update": {"no_grad": 4, "grad": 8}}
    assert rows[3]["rows_forwarded"] == {"today": {"no_grad": 12, "grad": 8}, "update": {"no_grad": 0, "grad": 12}}
    assert "today/update" in proc.stdout


@pytest.mark.parametrize("perturbed", ["self_certainty", "advantages"])
def test_update_self_certainty_bench_refuses_a_ratio_when_the_sides_differ(monkeypatch, tmp_path, perturbed):
    """One side's s(r) (or advantages) moved by 1e-3, far above the check's float32 tolerance: the benchmark stops
    before timing that configuration and writes no result."""
    import dataclasses

    from shop_r1.algo.advantages import GroupAdvantages
    from shop_r1.learner import grpo_step

    real = grpo_step.grpo_update_with_self_certainty

    def moved(*args, **kwargs):
        out = real(*args, **kwargs)
        if perturbed == "self_certainty":
            return dataclasses.replace(out, self_certainty=[out.self_certainty[0] + 1e-3, *out.self_certainty[1:]])
        adv = out.advantages
        return dataclasses.replace(out, advantages=GroupAdvantages(adv.advantages + 1e-3, adv.zero_signal))

    monkeypatch.setattr(grpo_step, "grpo_update_with_self_certainty", moved)
    out = tmp_path / "update_sc.json"
    name = "s\\(r\\)" if perturbed == "self_certainty" else "advantages"
    with pytest.raises(bench_update_self_certainty.MismatchError, match=f"no ratio is reported: {name}"):
        bench_update_self_certainty.main([*TINY_UPDATE_SC, "--json-out", str(out)])
    assert not out.exists()
    monkeypatch.setattr(grpo_step, "grpo_update_with_self_certainty", real)  # teeth: unmoved, it reports
    assert bench_update_self_certainty.main([*TINY_UPDATE_SC, "--dropped-groups", "1", "--breaks-ties", "false",
                                             "--json-out", str(out)])["results"][0]["ratio_today_over_update"] > 0
