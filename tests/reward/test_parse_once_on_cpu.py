"""A completion is parsed once, by the reward stage; what it found (action, rationale span, validity) travels on the
scored record to the batch builder (rationale tokens) and the rollout metrics (action mix)."""

import pytest
import torch

import shop_r1.reward.scorer as scorer_module
from shop_r1.algo.batch import build_grpo_batch
from shop_r1.config import RewardConfig
from shop_r1.reward.format import parse_response
from shop_r1.reward.worker import RewardWorker
from shop_r1.rollout.metrics import rollout_metrics
from shop_r1.types import Action, Completion, Generation, Prompt, RewardBreakdown, ScoredGeneration, ScoreRequest

CLICK = Action("click", name="buy")
TEXTS = ['{"rationale": "I want it.", "action": {"type": "click", "name": "buy"}}',
         '{"rationale": "Done here.", "action": {"type": "terminate"}}',
         "not json at all"]


def _completion(text):
    n = 6
    step = max(1, len(text) // n)
    return Completion(tuple(range(10, 10 + n)), text, (-0.5,) * n, ((-0.5,),) * n, tuple(i * step for i in range(n)),
                      "stop", 0)


def _scored(rewards):
    gen = Generation(0, (1, 2, 3), tuple(_completion(t) for t in TEXTS), vocab_size=100)
    return [ScoredGeneration(Prompt("ex0", (1, 2, 3), CLICK), gen, tuple(rewards))]


def test_each_completion_is_parsed_once_per_step(monkeypatch):
    calls = []

    def counting(text):
        calls.append(text)
        return parse_response(text)

    monkeypatch.setattr(scorer_module, "parse_response", counting)
    rewards = RewardWorker(RewardConfig(), scorer_module.score_response).score(
        [ScoreRequest(t, CLICK) for t in TEXTS])
    assert calls == TEXTS
    assert [r.parsed for r in rewards] == [parse_response(t) for t in TEXTS]
    scored = _scored(rewards)
    batch = build_grpo_batch(scored, torch.zeros(1, 3, dtype=torch.float64), pad_id=0)
    metrics = rollout_metrics(scored)
    assert calls == TEXTS  # neither the batch builder nor the metrics parsed again
    assert batch.rationale_mask[0].sum() > 0 and batch.rationale_mask[1].sum() > 0
    assert batch.rationale_mask[2].sum() == 0
    assert metrics["rollout/type_click"] == pytest.approx(1 / 3)
    assert metrics["rollout/type_terminate"] == pytest.approx(1 / 3)
    assert metrics["rollout/type_invalid"] == pytest.approx(1 / 3)


def test_the_consumers_read_the_record_not_the_text():
    # The same texts with records that say "nothing parsed" (e.g. the scoring failed): no rationale, all invalid.
    scored = _scored([RewardBreakdown(error="TimeoutError: scorer") for _ in TEXTS])
    batch = build_grpo_batch(scored, torch.zeros(1, 3, dtype=torch.float64), pad_id=0)
    assert int(batch.rationale_mask.sum()) == 0
    assert rollout_metrics(scored)["rollout/type_invalid"] == 1.0


def plugin_reward(response, target, cfg, logprobs):
    return RewardBreakdown(value=1.0, total=1.0, format_valid=True)  # a plug-in that does not fill `parsed`


def test_a_plugin_reward_gets_the_parse_filled_by_the_worker():
    rewards = RewardWorker(RewardConfig(), plugin_reward).score([ScoreRequest(t, CLICK) for t in TEXTS])
    assert [r.parsed for r in rewards] == [parse_response(t) for t in TEXTS]
    assert [r.total for r in rewards] == [1.0, 1.0, 1.0]
