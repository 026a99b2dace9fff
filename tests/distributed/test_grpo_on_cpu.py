"""GRPO end to end with the real components on CPU: vLLM engine actor, reward pool, DeepSpeed learner with the
frozen reference, gloo weight sync, checkpoints and resume."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from shop_r1.config import load_config
from shop_r1.data.encode import encode_prompts
from shop_r1.data.examples import build_rl_examples, chat_token_counter
from shop_r1.data.synth import synthesize_sessions
from shop_r1.train import run_grpo

METRIC_KEYS = {"reward/format", "reward/action_type", "reward/attribute", "reward/value", "reward/self_certainty",
               "reward/total", "rollout/type_click", "rollout/type_type_and_submit", "rollout/type_terminate",
               "rollout/response_tokens_mean", "train/kl", "train/clip_fraction", "train/zero_signal_groups",
               "timing/rollout", "timing/reward", "timing/update", "timing/weight_sync",
               "throughput/generated_tokens_per_s", "weight_sync/check_max_abs_logprob_diff",
               "train/sampler_logprob_abs_diff_mean", "train/sampler_logprob_abs_diff_max", "policy_version"}


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    examples = build_rl_examples(synthesize_sessions(6, seed=0), "whole_session", 1200,
                                 chat_token_counter(tok)).examples
    return encode_prompts(tok, examples, 1200)


@pytest.fixture(scope="module")
def engines(ray_local_cluster, tiny_model_dir, tmp_path_factory):
    """One engine group for the module's runs (run_grpo(engines=...)): built as `_cfg`'s runs would build theirs,
    each run's first push gives it that run's weights and version, so the runs pay for one engine start."""
    from shop_r1.distributed.engine_group import EngineGroup
    from shop_r1.rollout.engine import max_model_len

    cfg = _cfg(tmp_path_factory.mktemp("engines"), 1)
    group = EngineGroup(str(tiny_model_dir), cfg.rollout, max_model_len(cfg, str(tiny_model_dir)), cfg.seed,
                        local=False)
    yield group
    group.shutdown()


def variety_reward(response, target, cfg, logprobs):
    """A dense reward any policy gets a spread of: the share of distinct characters (a GRPO test signal)."""
    from shop_r1.types import RewardBreakdown

    value = len(set(response)) / (len(response) + 1)
    return RewardBreakdown(value=value, total=value, format_valid=True)


def _register_by_value():
    import sys

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _cfg(run_dir, steps):
    return load_config(None, [f"run_dir={run_dir}", f"rl.steps={steps}", "rollout.group_size=4",
                              "rl.global_batch_size=8", "rollout.max_new_tokens=16", "rl.lr=1e-3",
                              "rl.kl_beta=0.1", "rl.checkpoint_every=1", "rl.check_weight_sync=true",
                              "logging.wandb=false", "rollout.kv_cache_gib=1", "reward_pool.num_workers=1",
                              "rollout.temperature=0.6", "reward.dars_factor=1"])


def _weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.mark.slow
def test_grpo_steps_sync_checkpoint_and_resume(ray_local_cluster, tiny_model_dir, prompts, engines, tmp_path):
    _register_by_value()
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    full = run_grpo(_cfg(tmp_path / "a", 3), str(tiny_model_dir), prompts, tmp_path / "a" / "rl", local=False,
                    pad_id=pad, score_fn=variety_reward, engines=engines)
    assert full.num_steps == 3
    assert engines.policy_versions() == [3]  # the caller's engines outlive the run, with its last weights
    logged = [json.loads(line) for line in (tmp_path / "a" / "metrics_grpo.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3]
    for r in logged:
        assert METRIC_KEYS <= set(r), METRIC_KEYS - set(r)
        # Each actor runs as many torch threads as the Ray CPUs it reserved (1 each here; the demos reserve 2).
        assert r["threads/engine_min"] == 1 and r["threads/learner_min"] == 1
        # After every sync the engine computes the learner's logprobs (fp32), greedy and at T = 0.6 on the samples.
        assert r["weight_sync/check_max_abs_logprob_diff"] < 1e-4
        assert r["train/sampler_logprob_abs_diff_max"] < 1e-4
        # The stages partition the step (timing/other used to count timing/advantages a second time).
        stages = ("rollout", "reward", "advantages", "update", "weight_sync", "other")
        assert sum(r[f"timing/{k}"] for k in stages) == pytest.approx(r["timing/step"], abs=1e-6)
        assert r["timing/other"] >= -1e-6
    # The dump: every sample of every step, stamped by the engines with the version that sampled it.
    dumped = [json.loads(line) for line in (tmp_path / "a" / "rollouts.jsonl").read_text().splitlines()]
    assert [d["step"] for d in dumped] == [1, 1, 2, 2, 3, 3]  # 2 prompts x group 4 per step
    for d in dumped:
        assert len(d["samples"]) == 4 and d["prompt_token_ids"]
        assert {x["policy_version"] for x in d["samples"]} == {d["step"] - 1}
        assert [r["policy_version"] for r in logged if r["step"] == d["step"]] == [d["step"] - 1]
        for x in d["samples"]:
            assert len(x["token_ids"]) == len(x["logprobs"]) > 0 and x["reward"]["format_valid"] is True
        advantages = [x["advantage"] for x in d["samples"]]
        assert abs(sum(advantages)) < 1e-9 or all(a == 0 for a in advantages)
    assert all(r["train/zero_signal_groups"] < 2 for r in logged)  # the dense reward gives every step a signal
    before, after = _weights(tiny_model_dir), _weights(tmp_path / "a" / "rl" / "hf")
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)

    # A run killed after its step-2 checkpoint: a resume from a copy of it does the 3rd step. (A real run's own
    # `latest` and a kill: tests/distributed/test_train_kill_resume_on_cpu.py, test_learner_restart_on_cpu.py.)
    step2 = tmp_path / "a" / "rl" / "checkpoints" / "step_000002"
    (tmp_path / "b" / "rl" / "checkpoints").mkdir(parents=True)
    shutil.copytree(step2, tmp_path / "b" / "rl" / "checkpoints" / "step_000002")
    (tmp_path / "b" / "rl" / "checkpoints" / "latest").write_text("step_000002")
    resumed = run_grpo(_cfg(tmp_path / "b", 3), str(tiny_model_dir), prompts, tmp_path / "b" / "rl", local=False,
                       resume=True, pad_id=pad, score_fn=variety_reward, engines=engines)
    assert resumed.num_steps == 3
    batches_a = [json.loads(x) for x in (tmp_path / "a" / "rl" / "batches.jsonl").read_text().splitlines()]
    batches_b = [json.loads(x) for x in (tmp_path / "b" / "rl" / "batches.jsonl").read_text().splitlines()]
    assert [b["step"] for b in batches_b] == [3]
    assert batches_b[0]["example_ids"] == batches_a[2]["example_ids"]  # the same next batch
    wa, wb = _weights(tmp_path / "a" / "rl" / "hf"), _weights(tmp_path / "b" / "rl" / "hf")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-5, rtol=1e-4, msg=k)  # the same weights


@pytest.mark.slow
def test_grpo_with_two_zero3_learner_ranks(ray_local_cluster, tiny_model_dir, prompts, engines, tmp_path):
    """K = 2 DeepSpeed ranks under ZeRO-3: every rank takes part in the full-weight gather for the sync, and the
    engine then computes the learner's logprobs. (A plug-in reward, as here, gets no learner self-certainty forward;
    that forward on ZeRO-3 ranks, each scoring its own share: tests/distributed/test_learner_ranks_on_cpu.py.) The
    sync sends each gathered tensor as it lies (weight_sync.zero_copy), before the gather is released, and loads it in
    place (rollout.weight_load=auto on this layout)."""
    _register_by_value()
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    cfg = _cfg(tmp_path, 2)
    cfg.learner.num_ranks, cfg.learner.zero_stage, cfg.learner.num_cpus_per_rank = 2, 3, 0.5
    cfg.weight_sync.zero_copy = True
    result = run_grpo(cfg, str(tiny_model_dir), prompts, tmp_path / "rl", local=False, pad_id=pad,
                      score_fn=variety_reward, engines=engines)
    assert result.num_steps == 2
    logged = [json.loads(line) for line in (tmp_path / "metrics_grpo.jsonl").read_text().splitlines()]
    for r in logged:
        assert r["policy_version"] == r["step"] - 1
        assert r["weight_sync/check_max_abs_logprob_diff"] < 1e-4
        assert r["train/sampler_logprob_abs_diff_max"] < 1e-4
        assert r["weight_sync/in_place"] == 1.0
    before, after = _weights(tiny_model_dir), _weights(tmp_path / "rl" / "hf")
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


@pytest.mark.slow
def test_one_step_off_async_lags_by_one_and_resumes_exactly(ray_local_cluster, tiny_model_dir, prompts, engines,
                                                             tmp_path):
    """rl.async_level=1 under Ray: step t+1 is generated while step t's update runs, by the weights of step t-1.
    Every sample's lag (stamped by the engines, dumped per sample) is at most 1; the importance weight corrects the
    surrogate. A run resumed from the step-2 checkpoint takes the rollout that checkpoint holds for step 3 and ends
    with the uninterrupted run's samples and weights."""
    _register_by_value()
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id

    def cfg(run_dir):
        c = _cfg(run_dir, 4)
        c.rl.async_level, c.rl.checkpoint_every, c.rl.check_weight_sync = 1, 2, False
        return c

    run_grpo(cfg(tmp_path / "a"), str(tiny_model_dir), prompts, tmp_path / "a" / "rl", local=False, pad_id=pad,
             score_fn=variety_reward, engines=engines)
    logged = [json.loads(line) for line in (tmp_path / "a" / "metrics_grpo.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in logged] == [0, 0, 1, 2]
    assert [r["rollout/policy_lag_max"] for r in logged] == [0, 1, 1, 1]
    dumped = [json.loads(line) for line in (tmp_path / "a" / "rollouts.jsonl").read_text().splitlines()]
    for d in dumped:
        assert {x["policy_lag"] for x in d["samples"]} == {0 if d["step"] == 1 else 1}
        assert {x["policy_version"] for x in d["samples"]} == {max(d["step"] - 2, 0)}
    # Step 1 is on-policy (weight 1 up to numerics); later steps are sampled by the weights before the previous
    # update (lr 1e-3 moved them): the engine's and the learner's logprobs differ and the weights are not all 1.
    assert logged[0]["train/sampler_logprob_abs_diff_max"] < 1e-4
    assert logged[0]["train/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert all(r["train/sampler_logprob_abs_diff_mean"] > 1e-4 for r in logged[1:])
    assert all(0 < r["train/is_weight_mean"] <= 2.0 and r["train/is_weight_mean"] != 1.0 for r in logged[1:])
    for r in logged:
        stages = ("rollout", "reward", "advantages", "update", "weight_sync", "other")
        assert sum(r[f"timing/{k}"] for k in stages) == pytest.approx(r["timing/step"], abs=1e-6)
    step2 = tmp_path / "a" / "rl" / "checkpoints" / "step_000002"
    assert (step2 / "pending_rollout.json").is_file()

    # A run killed after its step-2 checkpoint: resume from a copy of it.
    (tmp_path / "b" / "rl" / "checkpoints").mkdir(parents=True)
    shutil.copytree(step2, tmp_path / "b" / "rl" / "checkpoints" / "step_000002")
    (tmp_path / "b" / "rl" / "checkpoints" / "latest").write_text("step_000002")
    run_grpo(cfg(tmp_path / "b"), str(tiny_model_dir), prompts, tmp_path / "b" / "rl", local=False, resume=True,
             pad_id=pad, score_fn=variety_reward, engines=engines)
    resumed = [json.loads(line) for line in (tmp_path / "b" / "rollouts.jsonl").read_text().splitlines()]
    assert [d["step"] for d in resumed] == [3, 3, 4, 4]
    for a, b in zip(dumped[4:], resumed):
        assert a["example_id"] == b["example_id"]
        assert [x["token_ids"] for x in a["samples"]] == [x["token_ids"] for x in b["samples"]]
        assert [x["policy_version"] for x in a["samples"]] == [x["policy_version"] for x in b["samples"]]
    wa, wb = _weights(tmp_path / "a" / "rl" / "hf"), _weights(tmp_path / "b" / "rl" / "hf")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-5, rtol=1e-4, msg=k)


def brevity(prompts, completions, target, **kwargs):
    """A batched TRL-style reward function (reward.functions): 1 for a completion under 40 characters, None (does not
    apply) for a terminate target."""
    return [None if t.type == "terminate" else float(len(c) < 40) for c, t in zip(completions, target)]


@pytest.mark.slow
def test_a_reward_function_from_the_config_trains_beside_the_shop_r1_terms(ray_local_cluster, tiny_model_dir,
                                                                           prompts, engines, tmp_path):
    """reward.functions: the user's function is added to the default terms and logged as reward/<name>."""
    _register_by_value()
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    cfg = load_config(None, [f"run_dir={tmp_path}", "rl.steps=2", "rollout.group_size=4", "rl.global_batch_size=8",
                             "rollout.max_new_tokens=16", "rl.lr=1e-3", "logging.wandb=false",
                             "rollout.kv_cache_gib=1", "reward_pool.num_workers=1", "rollout.temperature=0.6",
                             f"reward.functions=[{{fn: '{__name__}:brevity', weight: 2.0}}]"])
    result = run_grpo(cfg, str(tiny_model_dir), prompts, tmp_path / "rl", local=False, pad_id=pad, engines=engines)
    assert result.num_steps == 2
    logged = [json.loads(line) for line in (tmp_path / "metrics_grpo.jsonl").read_text().splitlines()]
    dumped = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    targets = {p.example_id: p.target for p in prompts}
    assert len(logged) == 2 and len(dumped) == 4  # 2 steps of 2 groups of 4
    for r in logged:
        assert {"reward/brevity", "reward/brevity_applied", "reward/format", "reward/total"} <= set(r)
        groups = [g for g in dumped if g["step"] == r["step"]]
        samples = [(s, targets[g["example_id"]]) for g in groups for s in g["samples"]]
        # The function's own value reached every sample's breakdown: None exactly on terminate targets, else
        # 1 for a completion under 40 characters (the dump's text is the completion the function saw).
        for s, t in samples:
            want = None if t.type == "terminate" else float(len(s["text"]) < 40)
            assert s["reward"]["brevity"] == want
            rw = s["reward"]  # the total: the Shop-R1 terms plus weight 2 x the function's value
            base = rw["format"] + rw["action_type"] + rw["attribute"] + rw["value"] \
                + cfg.reward.alpha * rw["self_certainty"] * cfg.reward.rationale_reward
            assert rw["total"] == pytest.approx(base + 2.0 * (want or 0.0), abs=1e-9)
        applied = [float(len(s["text"]) < 40) for s, t in samples if t.type != "terminate"]
        assert r["reward/brevity_applied"] == pytest.approx(len(applied) / len(samples))
        assert r["reward/brevity"] == pytest.approx(sum(applied) / len(applied) if applied else 0.0)
