"""GRPO made exact, the pure parts: float64 rewards and advantages, the exact self-certainty lined up with its
response, the batch's temperature, padding rows that train nothing, the rollout dump and the version check."""

import dataclasses

import pytest
import torch

from shop_r1.algo.advantages import group_advantages
from shop_r1.algo.batch import build_grpo_batch
from shop_r1.config import Config, ConfigError, RewardConfig, validate
from shop_r1.reward.scorer import score_response, with_exact_self_certainty
from shop_r1.rollout.records import PolicyVersionMismatch, check_policy_versions, rollout_records
from shop_r1.train import update_batch, with_learner_self_certainty
from shop_r1.types import Action, Completion, Generation, Prompt, RewardBreakdown, ScoredGeneration

CLICK = Action("click", name="buy")
VALID = '{"rationale": "I want it.", "action": {"type": "click", "name": "buy"}}'


def _completion(text, version=0, n_tokens=3):
    step = max(1, len(text) // n_tokens)
    return Completion(token_ids=tuple(range(10, 10 + n_tokens)), text=text, logprobs=(-0.5,) * n_tokens,
                      topk_logprobs=((-0.5,),) * n_tokens, token_offsets=tuple(i * step for i in range(n_tokens)),
                      finish_reason="stop", policy_version=version)


def _scored(texts, example_id="ex0", version=0, cfg=None):
    cfg = cfg if cfg is not None else RewardConfig()
    gen = Generation(0, (1, 2, 3), tuple(_completion(t, version) for t in texts), vocab_size=100)
    rewards = tuple(score_response(t, CLICK, cfg) for t in texts)
    return ScoredGeneration(Prompt(example_id, (1, 2, 3), CLICK), gen, rewards)


def test_advantages_keep_self_certainty_differences_at_dars_scale():
    # Totals 1001.5 + alpha * s with s = 0.001, 0.002, 0.003, 0.004 (alpha = 0.005): differences of 5e-6, below
    # float32's spacing at 1000 (6.1e-5), so float32 sees one value (no signal). In float64: mean 1001.5 +
    # 0.0000125, deviations (-1.5, -0.5, 0.5, 1.5) * 5e-6, unbiased std 5e-6 * sqrt(5/3) -> A = (-1.1619,
    # -0.3873, 0.3873, 1.1619).
    totals = [[1001.5 + 0.005 * s for s in (0.001, 0.002, 0.003, 0.004)]]
    as_float32 = torch.tensor(totals, dtype=torch.float32)
    assert bool((as_float32 == as_float32[0, 0]).all())  # float32 rounds the signal away
    out = group_advantages(torch.tensor(totals, dtype=torch.float64), eps=0.0)
    assert out.advantages.dtype == torch.float64 and out.num_zero_signal_groups == 0
    torch.testing.assert_close(out.advantages[0], torch.tensor([-1.161895, -0.387298, 0.387298, 1.161895],
                                                               dtype=torch.float64), atol=1e-5, rtol=0)


def test_exact_self_certainty_stays_with_its_response_around_invalid_ones():
    # Responses 0 and 2 are format-invalid; the learner returns one value per response (0 for those).
    cfg = RewardConfig()
    scored = [_scored(["not json", VALID, "{broken"]), _scored([VALID, VALID, "x"], "ex1")]
    values = [0.0, 2.0, 0.0, 4.0, 6.0, 0.0]
    out = with_learner_self_certainty(scored, values, Config(reward=cfg))
    got = [(r.self_certainty, r.total) for s in out for r in s.rewards]
    base = 0.5 + 0.3 + 0.2 + 1000.0 * 1.0  # format + type + attribute + DARS * ROUGE-L("buy", "buy")
    assert got == [(0.0, 0.0), (2.0, base + 0.005 * 2.0), (0.0, 0.0),
                   (4.0, base + 0.005 * 4.0), (6.0, base + 0.005 * 6.0), (0.0, 0.0)]
    with pytest.raises(ValueError, match="5 self-certainty values for 6"):
        with_learner_self_certainty(scored, values[:5], Config(reward=cfg))


def test_exact_self_certainty_replaces_not_adds_and_respects_the_ablation():
    r = RewardBreakdown(format=0.5, self_certainty=1.0, total=10.005, format_valid=True)
    (new,) = with_exact_self_certainty([r], [3.0], RewardConfig())
    assert new.self_certainty == 3.0 and new.total == pytest.approx(10.015)
    (off,) = with_exact_self_certainty([r], [3.0], RewardConfig(rationale_reward=False))
    assert off.self_certainty == 3.0 and off.total == pytest.approx(10.005)


def test_batch_carries_the_sampling_temperature_and_float64_advantages():
    scored = [_scored([VALID, "x"])]
    adv = torch.tensor([[1001.5 + 1e-6, -3.0]], dtype=torch.float64)
    batch = build_grpo_batch(scored, adv, pad_id=0, temperature=0.6)
    assert batch.temperature == 0.6 and batch.advantages.dtype == torch.float64
    assert float(batch.advantages[0]) == 1001.5 + 1e-6
    assert batch.select([1]).temperature == 0.6
    assert build_grpo_batch(scored, adv, pad_id=0, temperature=0.0).temperature == 1.0  # greedy: T = 1 logprobs


def test_empty_rows_train_nothing():
    batch = build_grpo_batch([_scored([VALID, VALID])], torch.zeros(1, 2, dtype=torch.float64), 0, 0.6)
    empty = batch.empty_like(rows=1)
    assert empty.num_responses == 1 and empty.num_trained_responses == 0
    assert int(empty.completion_mask.sum()) == 0 and empty.temperature == 0.6
    assert batch.select([]).num_responses == 0 and batch.num_trained_responses == 2


def test_sampling_config_checks():
    validate(Config(), "train")  # defaults: T = 0.6 with the exact (learner) self-certainty
    cfg = Config()
    cfg.reward.self_certainty.source = "topk_logprobs"
    with pytest.raises(ConfigError, match="rollout.temperature=1"):
        validate(cfg, "train")
    cfg.rollout.temperature = 1.0
    validate(cfg, "train")
    cfg.rollout.temperature = 0.0
    with pytest.raises(ConfigError, match="rollout.temperature=0.0 is out of range"):
        validate(cfg, "train")


def test_policy_version_check_names_the_stale_sample():
    fresh, stale = _scored([VALID], "ex0", version=3), _scored([VALID], "ex7", version=2)
    assert check_policy_versions([fresh], expected=3) == 3
    with pytest.raises(PolicyVersionMismatch, match=r"\[2, 3\].*version 3.*ex7"):
        check_policy_versions([fresh, stale], expected=3)


def test_rollout_records_hold_everything_an_audit_needs():
    scored = [_scored([VALID, "x"], "ex3", version=5)]
    (rec,) = rollout_records(6, scored, [[0.7, -0.7]])
    assert rec["step"] == 6 and rec["example_id"] == "ex3" and rec["prompt_token_ids"] == [1, 2, 3]
    a, b = rec["samples"]
    assert a["text"] == VALID and a["token_ids"] == [10, 11, 12] and a["logprobs"] == [-0.5] * 3
    assert a["advantage"] == 0.7 and b["advantage"] == -0.7 and a["policy_version"] == 5
    assert a["reward"]["total"] == scored[0].rewards[0].total and a["reward"]["format_valid"] is True
    assert b["reward"]["format_valid"] is False and b["reward"]["error"] is None
    assert dataclasses.asdict(scored[0].rewards[0])["value"] == a["reward"]["value"]


def test_loss_tokens_action_trains_only_the_tokens_outside_the_rationale():
    # VALID's rationale "I want it." is characters 15..25. Six tokens at offsets 0, 15, 20, 25, 40, 60: the 2nd and
    # 3rd lie in it, the 1st ('{"rationale": "') and the last three (the closing quote and the action) do not.
    completion = Completion(token_ids=tuple(range(10, 16)), text=VALID, logprobs=(-0.5,) * 6,
                            topk_logprobs=((-0.5,),) * 6, token_offsets=(0, 15, 20, 25, 40, 60),
                            finish_reason="stop", policy_version=0)
    gen = Generation(0, (1, 2, 3), (completion,), vocab_size=100)
    scored = [ScoredGeneration(Prompt("ex0", (1, 2, 3), CLICK), gen, (score_response(VALID, CLICK, RewardConfig()),))]
    batch = build_grpo_batch(scored, torch.ones(1, 1, dtype=torch.float64), pad_id=0, temperature=0.6)
    assert batch.completion_mask[0].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert batch.rationale_mask[0].tolist() == [0, 0, 0, 0, 1, 1, 0, 0, 0]
    action = batch.outside_rationale()
    assert action.completion_mask[0].tolist() == [0, 0, 0, 1, 0, 0, 1, 1, 1]
    assert action.rationale_mask.tolist() == batch.rationale_mask.tolist()  # s(r) still reads the rationale
    cfg = Config()
    cfg.rl.loss_tokens = "action"
    validate(cfg, "train")
    adv = group_advantages(torch.tensor([[1.0, 2.0]], dtype=torch.float64))
    two = build_grpo_batch([_scored([VALID, VALID])], adv.advantages, pad_id=0, temperature=0.6)
    trained = update_batch(two, adv, cfg)  # the driver's batch for the learner
    assert torch.equal(trained.completion_mask, two.outside_rationale().completion_mask)
    assert int(trained.completion_mask.sum()) < int(two.completion_mask.sum())
    cfg.reward.self_certainty.source = "update_logits"
    with pytest.raises(ConfigError, match="rl.loss_tokens=action"):
        validate(cfg, "train")
