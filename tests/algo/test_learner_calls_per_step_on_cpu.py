"""How many times a GRPO step calls the learner group for its update (train.prepare_update + train.update_step, no
Ray, a fake learner group that counts): one call per step, besides the weight sync, in every
reward.self_certainty.source (learner_logits: the no-grad s(r) forward and the update in one call)."""

import pytest
import torch

from shop_r1.algo.advantages import GroupAdvantages
from shop_r1.algo.step_rewards import UpdateWithSelfCertainty
from shop_r1.config import load_config
from shop_r1.reward.scorer import score_response
from shop_r1.train import prepare_update, update_step
from shop_r1.types import GRPOStepStats
from tests.algo.test_exact_grpo_on_cpu import VALID, _scored

OTHER = '{"rationale": "Looking around first.", "action": {"type": "terminate"}}'
STATS = GRPOStepStats(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_mean=1.0, grad_norm=0.0, num_tokens=1, step=1)


class CountingLearners:
    """Records each call the driver makes; answers with fixed numbers."""

    def __init__(self):
        self.calls = []

    def rationale_self_certainty(self, batch, direction, normalize_by_vocab=False):
        self.calls.append("rationale_self_certainty")
        return [1.0] * batch.num_responses

    def grpo_step(self, batch, loss_cfg):
        self.calls.append("grpo_step")
        return [STATS]

    def grpo_step_after_self_certainty(self, batch, loss_cfg, rewards, adv_cfg, action_only):
        self.calls.append("grpo_step_after_self_certainty")
        return self._with_self_certainty(batch, rewards)

    def grpo_step_with_self_certainty(self, batch, loss_cfg, rewards, adv_cfg):
        self.calls.append("grpo_step_with_self_certainty")
        return self._with_self_certainty(batch, rewards)

    def _with_self_certainty(self, batch, rewards):
        adv = GroupAdvantages(torch.zeros(len(rewards.rewards), rewards.group_size, dtype=torch.float64),
                              torch.zeros(len(rewards.rewards), dtype=torch.bool))
        return [UpdateWithSelfCertainty(STATS, [1.0] * batch.num_responses, adv, updated=True)]


@pytest.mark.parametrize("source", ["topk_logprobs", "update_logits", "learner_logits"])
def test_a_grpo_step_calls_the_learner_group_once(source):
    cfg = load_config(None, ["rollout.group_size=2", "rl.global_batch_size=4", "rollout.temperature=1",
                             f"reward.self_certainty.source={source}"])
    scored, learners = [_scored([VALID, OTHER], "ex0"), _scored([OTHER, VALID], "ex1")], CountingLearners()
    prepared = prepare_update(scored, learners, cfg, pad_id=0, score_fn=score_response)
    update_step(learners, prepared, cfg)
    assert len(learners.calls) == 1, learners.calls
