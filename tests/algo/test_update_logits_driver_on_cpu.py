"""The driver's side of reward.self_certainty.source=update_logits (train.prepare_update + train.update_step, no Ray):
the advantages stage makes no learner call (the update's own forward gives s(r)), and the step ends with the same
scored groups (exact s(r), re-formed totals), advantages, update figures, gradient, logged metric keys and rollout
records as learner_logits, on one in-process plain-torch learner rank over the tiny Qwen2."""

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from shop_r1.config import LearnerConfig, load_config
from shop_r1.distributed.engine_group import ScoredBatch
from shop_r1.distributed.protocols import SyncStats
from shop_r1.distributed.rollouts import StepRollout
from shop_r1.learner.grpo_step import (
    grpo_update,
    grpo_update_after_self_certainty,
    grpo_update_with_self_certainty,
    rationale_self_certainty,
)
from shop_r1.reward.scorer import score_response
from shop_r1.rollout.records import rollout_records
from shop_r1.train import SKIPPED, prepare_update, step_metrics, update_step
from shop_r1.types import Action, Completion, Generation, Prompt, ScoredGeneration
from tests.learner.test_grpo_step_on_cpu import TorchBackend

CLICK = Action("click", name="buy")
VALID = '{"rationale": "I want it now.", "action": {"type": "click", "name": "buy"}}'
TERMINATE = '{"rationale": "Nothing more to do.", "action": {"type": "terminate"}}'


class InProcessLearners:
    """The learner group's GRPO calls on one in-process rank, recording which ran."""

    world_size = 1

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def rationale_self_certainty(self, batch, direction, normalize_by_vocab=False):
        self.calls.append("rationale_self_certainty")
        return rationale_self_certainty(self.backend, batch, direction, normalize_by_vocab)

    def grpo_step(self, batch, loss_cfg):
        self.calls.append("grpo_step")
        return [grpo_update(self.backend, batch, loss_cfg, step=1)]

    def grpo_step_with_self_certainty(self, batch, loss_cfg, rewards, adv_cfg):
        self.calls.append("grpo_step_with_self_certainty")
        return [grpo_update_with_self_certainty(self.backend, batch, loss_cfg, rewards, adv_cfg, 0, step=1)]

    def grpo_step_after_self_certainty(self, batch, loss_cfg, rewards, adv_cfg, action_only):
        self.calls.append("grpo_step_after_self_certainty")
        return [grpo_update_after_self_certainty(self.backend, batch, loss_cfg, rewards, adv_cfg, action_only, 0, 1,
                                                 step=1)]


def _group(example_id, texts, seed):
    """One prompt of 6 tokens and its responses, each of 12 random tokens spread evenly over its text."""
    g = torch.Generator().manual_seed(seed)
    completions = []
    for text in texts:
        ids = torch.randint(10, 1000, (12,), generator=g).tolist()
        step = len(text) // 12
        completions.append(Completion(token_ids=tuple(ids), text=text, logprobs=(-0.7,) * 12,
                                      topk_logprobs=((-0.7,),) * 12, token_offsets=tuple(i * step for i in range(12)),
                                      finish_reason="stop", policy_version=0))
    prompt = Prompt(example_id, tuple(range(20 + seed, 26 + seed)), CLICK)
    rewards = tuple(score_response(t, CLICK, load_config(None).reward) for t in texts)
    return ScoredGeneration(prompt, Generation(0, prompt.token_ids, tuple(completions), vocab_size=1836), rewards)


def _scored():
    """Group 0: both format-invalid (zero-signal, dropped); group 1: the same right click twice (s(r) breaks the
    tie); group 2: a right click and a terminate."""
    return [_group("ex0", ["not json", "{broken"], 0), _group("ex1", [VALID, VALID + " "], 1),
            _group("ex2", [VALID, TERMINATE], 2)]


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return policy, reference.requires_grad_(False)


def _step(models, source, scored):
    cfg = load_config(None, ["rollout.group_size=2", "rl.global_batch_size=6", "rl.drop_zero_signal_groups=true",
                             "rl.kl_beta=0.1", f"reward.self_certainty.source={source}"])
    policy, reference = models
    learners = InProcessLearners(TorchBackend(policy, LearnerConfig(max_tokens_per_micro_batch=40), reference))
    prepared = prepare_update(scored, learners, cfg, pad_id=0, score_fn=score_response)
    before_update = list(learners.calls)
    scored, adv, update = update_step(learners, prepared, cfg)
    return before_update, learners, scored, adv, update


def _metrics(scored, adv, update):
    rollout = StepRollout(1, [s.prompt for s in scored], ScoredBatch(scored, 1.0, 0.1), 0, None)
    return step_metrics(scored, rollout, update, adv, SyncStats(0.1, 10), 0, (0.0, 1.0, 1.5, 2.0, 2.5))


def test_update_logits_makes_no_forward_before_the_update_and_ends_the_step_as_learner_logits(models):
    t_calls, today, t_scored, t_adv, t_update = _step(models, "learner_logits", _scored())
    o_calls, ours, o_scored, o_adv, o_update = _step(models, "update_logits", _scored())
    # The advantages stage (timing/advantages) calls no learner under either: each step is one learner call.
    assert t_calls == [] and o_calls == []
    assert today.calls == ["grpo_step_after_self_certainty"] and ours.calls == ["grpo_step_with_self_certainty"]
    # The same exact s(r) and totals in what is logged and dumped (format-invalid responses keep s = 0 and total 0).
    t_rewards = [r for s in t_scored for r in s.rewards]
    o_rewards = [r for s in o_scored for r in s.rewards]
    assert [r.format_valid for r in o_rewards] == [False, False, True, True, True, True]
    assert [r.self_certainty for r in o_rewards] == pytest.approx([r.self_certainty for r in t_rewards], rel=1e-6)
    # A total is format + action + alpha * s(r), so it carries alpha times s(r)'s error (rel 1e-6 above, from two
    # float32 forwards summed in different orders): e.g. 0.5000651445239782 vs ...286348 on an AVX2 EPYC, 9.3e-12
    # apart, within alpha * 1e-6 * s = 0.005 * 1e-6 * 0.013 = 6.5e-11; the rest of the total is the same float64 sum.
    alpha = load_config(None).reward.alpha
    sc_err = [alpha * 1e-6 * abs(r.self_certainty) + 1e-15 for r in t_rewards]
    for i, (o, t, err) in enumerate(zip(o_rewards, t_rewards, sc_err)):
        assert abs(o.total - t.total) <= err, (i, o.total, t.total)
    assert all(r.self_certainty > 0 for r in o_rewards[2:])
    assert o_adv.zero_signal.tolist() == t_adv.zero_signal.tolist() == [True, False, False]
    # Each group has two responses, so its advantages are +-(d/2) / (c|d| + eps), d = t1 - t2, whose relative error is
    # d's times eps / (c|d| + eps) <= 1: at most (e1 + e2) / |d|. In group 1 (the same click twice) d is alpha times
    # the difference of two near-equal s(r), so s(r)'s relative error grows by (s1 + s2) / |s1 - s2| (1.5e-6 measured
    # on an AVX-512 EPYC, past a flat 1e-6); group 2's d is a whole action reward.
    for g in range(3):
        i, j = 2 * g, 2 * g + 1
        d = abs(t_rewards[i].total - t_rewards[j].total)
        rel = max(1e-6, 1.01 * (sc_err[i] + sc_err[j]) / d) if d else 1e-6
        torch.testing.assert_close(o_adv.advantages[g], t_adv.advantages[g], rtol=rel, atol=1e-9, msg=f"group {g}")
    assert o_update.num_tokens == t_update.num_tokens == 4 * 12  # groups 1 and 2
    assert o_update.loss == pytest.approx(t_update.loss, rel=1e-5) and o_update.kl == pytest.approx(t_update.kl,
                                                                                                     rel=1e-5)
    (got,), (expected,) = ours.backend.grads, today.backend.grads
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-7, msg=name)
    # The same log line and rollout records (keys; the values above).
    t_metrics, o_metrics = _metrics(t_scored, t_adv, t_update), _metrics(o_scored, o_adv, o_update)
    assert o_metrics.keys() == t_metrics.keys() and "timing/advantages" in o_metrics
    assert o_metrics["train/zero_signal_groups"] == 1 and o_metrics["train/skipped_update"] == 0.0
    assert abs(o_metrics["reward/total"] - t_metrics["reward/total"]) <= max(sc_err)  # a mean of the totals above
    t_records = rollout_records(1, t_scored, t_adv.advantages.tolist())
    o_records = rollout_records(1, o_scored, o_adv.advantages.tolist())
    assert [r["samples"][1]["reward"].keys() for r in o_records] == [r["samples"][1]["reward"].keys()
                                                                      for r in t_records]


def test_a_step_with_nothing_to_train_is_skipped_as_today(models):
    tied = [_group("ex0", ["not json", "{broken"], 0), _group("ex1", ["x", "y"], 1)]
    for source in ("learner_logits", "update_logits"):
        _, learners, _, adv, update = _step(models, source, tied)
        assert update is SKIPPED and adv.num_zero_signal_groups == 2
        assert learners.backend.calls == []  # no backward, no optimizer step


def test_a_plugin_score_function_trains_as_today_under_update_logits(models):
    """A score function given in code (not reward.fn, which the config refuses with update_logits): no s(r)."""
    def plugin(response, target, cfg, logprobs):
        return dataclasses.replace(score_response(response, target, cfg), self_certainty=0.0)

    cfg = load_config(None, ["rollout.group_size=2", "rl.global_batch_size=6",
                             "reward.self_certainty.source=update_logits"])
    learners = InProcessLearners(TorchBackend(models[0], LearnerConfig()))
    prepared = prepare_update(_scored(), learners, cfg, pad_id=0, score_fn=plugin)
    assert prepared.adv is not None and learners.calls == []
    update_step(learners, prepared, cfg)
    assert learners.calls == ["grpo_step"]
