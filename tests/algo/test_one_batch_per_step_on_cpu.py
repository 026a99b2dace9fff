"""One batch per step (train.prepare_update, no Ray): the batch is built once, sent for the learner's exact s(r) only
when the Shop-R1 hybrid reward is the reward, then given the advantages of the re-formed totals. A plug-in reward's
totals reach the advantages unchanged, even when its responses parse and carry a rationale."""

import torch

from shop_r1.algo.advantages import group_advantages
from shop_r1.algo.step_rewards import StepRewards, UpdateWithSelfCertainty, totals_and_advantages
from shop_r1.config import load_config
from shop_r1.reward.scorer import score_response
from shop_r1.reward.worker import with_parse
from shop_r1.train import learner_self_certainty_applies, prepare_update, update_step, with_learner_self_certainty
from shop_r1.types import GRPOStepStats
from tests.algo.test_exact_grpo_on_cpu import CLICK, VALID, _scored

OTHER = '{"rationale": "Looking around first.", "action": {"type": "terminate"}}'
STATS = GRPOStepStats(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_mean=1.0, grad_norm=0.0, num_tokens=1, step=1)


class FakeLearners:
    """The learner group's self-certainty call: s(r) = 2 + i for the i-th response of the batch it is sent."""

    def __init__(self):
        self.batches, self.updates = [], []

    def rationale_self_certainty(self, batch, direction, normalize_by_vocab=False):
        self.batches.append(batch)
        return [2.0 + i for i in range(batch.num_responses)]

    def grpo_step_after_self_certainty(self, batch, loss_cfg, rewards, adv_cfg, action_only):
        """The one-call update (learner_logits): s(r) = 2 + i, the advantages as the learner computes them."""
        self.updates.append((batch, rewards))
        values = [2.0 + i for i in range(batch.num_responses)]
        owned = totals_and_advantages(rewards, adv_cfg, values)
        return [UpdateWithSelfCertainty(STATS, values, owned.advantages, updated=True)]


def plugin_reward(response, target, cfg, logprobs):
    """A plug-in reward (reward.fn): its own total, here the response's length / 100."""
    from shop_r1.types import RewardBreakdown

    return RewardBreakdown(value=len(response) / 100, total=len(response) / 100, format_valid=True)


def _plugin_scored():
    """Two prompts x two responses scored by the plug-in, parsed by the reward stage as the worker does (so each
    valid response has a rationale span and its tokens a rationale mask)."""
    scored = [_scored([VALID, OTHER], "ex0"), _scored([OTHER, VALID + " "], "ex1")]
    out = []
    for s in scored:
        rewards = tuple(with_parse(plugin_reward(c.text, CLICK, None, None), c.text, plugin_reward)
                        for c in s.generation.completions)
        out.append(type(s)(s.prompt, s.generation, rewards))
    return out


def test_a_plugin_rewards_totals_reach_the_advantages_unchanged():
    cfg = load_config(None, ["rollout.group_size=2", "rl.global_batch_size=4"])
    scored, learners = _plugin_scored(), FakeLearners()
    assert not learner_self_certainty_applies(cfg, plugin_reward)
    assert all(r.parsed is not None for s in scored for r in s.rewards)  # the old path would have re-formed these
    totals = torch.tensor([[r.total for r in s.rewards] for s in scored], dtype=torch.float64)
    prepared = prepare_update(scored, learners, cfg, pad_id=0, score_fn=plugin_reward)
    assert learners.batches == []  # no self-certainty forward at all
    assert [[r.total for r in s.rewards] for s in prepared.scored] == totals.tolist()
    expected = group_advantages(totals, scale=cfg.rl.scale_rewards).advantages
    assert torch.equal(prepared.adv.advantages, expected)
    assert torch.equal(prepared.batch.advantages, expected.reshape(-1))
    # Teeth: re-forming the totals with the learner's values (what used to happen) would have moved them.
    moved = with_learner_self_certainty(scored, [2.0, 3.0, 4.0, 5.0], cfg)
    assert [[r.total for r in s.rewards] for s in moved] != totals.tolist()


def test_the_shop_r1_reward_gets_the_exact_self_certainty_from_the_same_batch():
    """learner_logits: prepare_update sends nothing (no s(r) call); the one update call gets the batch itself and the
    step's rewards, and the driver re-forms the scored groups with the s(r) that call returns."""
    cfg = load_config(None, ["rollout.group_size=2", "rl.global_batch_size=4"])
    scored, learners = [_scored([VALID, OTHER], "ex0"), _scored([OTHER, VALID], "ex1")], FakeLearners()
    assert learner_self_certainty_applies(cfg, score_response)
    prepared = prepare_update(scored, learners, cfg, pad_id=0, score_fn=score_response)
    assert learners.batches == [] and prepared.adv is None  # s(r) and the advantages come with the update
    assert prepared.batch.advantages.abs().sum() == 0 and prepared.batch.temperature == cfg.rollout.temperature
    got, adv, update = update_step(learners, prepared, cfg)
    ((sent, rewards),) = learners.updates
    assert sent is prepared.batch  # one batch: the rows s(r) is taken on are the rows trained on
    assert rewards == StepRewards.of(scored)
    certainty = [r.self_certainty for s in got for r in s.rewards]
    assert certainty == [2.0, 3.0, 4.0, 5.0]
    # Totals re-formed: + alpha * s(r) on top of each original total (their engine s(r) was 0: no top-k logprobs).
    before = [r.total for s in scored for r in s.rewards]
    after = [r.total for s in got for r in s.rewards]
    assert after == [b + cfg.reward.alpha * c for b, c in zip(before, certainty)]
    totals = torch.tensor(after, dtype=torch.float64).view(2, 2)
    assert torch.equal(adv.advantages, group_advantages(totals).advantages) and update is STATS


def test_topk_self_certainty_needs_no_learner_forward_and_dropped_groups_leave_the_batch():
    cfg = load_config(None, ["rollout.group_size=2", "rl.global_batch_size=4", "rollout.temperature=1",
                             "reward.self_certainty.source=topk_logprobs", "rl.drop_zero_signal_groups=true"])
    scored, learners = [_scored([VALID, VALID], "ex0"), _scored([VALID, OTHER], "ex1")], FakeLearners()
    assert not learner_self_certainty_applies(cfg, score_response)
    prepared = prepare_update(scored, learners, cfg, pad_id=0, score_fn=score_response)
    assert learners.batches == [] and prepared.adv.zero_signal.tolist() == [True, False]
    assert prepared.batch.num_responses == 2  # group 0 tied: left out
    assert torch.equal(prepared.batch.advantages, prepared.adv.advantages[1])
