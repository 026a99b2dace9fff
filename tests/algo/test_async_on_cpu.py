"""One-step-off async (rl.async_level=1), the pure parts: the truncated importance weight in the loss, and the
order in which RolloutStream makes rollouts, stamps versions and hands its pending rollout to a checkpoint."""

import math
import threading
import time

import pytest
import torch

from shop_r1.algo.grpo_loss import LossInputs, grpo_loss, truncated_is_weight
from shop_r1.config import RLConfig
from shop_r1.data.sampler import PromptSampler
from shop_r1.distributed.engine_group import EngineFailure, ScoredBatch
from shop_r1.distributed.rollouts import RolloutStream, load_pending
from shop_r1.types import Action, Completion, Generation, Prompt, RewardBreakdown, SamplingSpec, ScoredGeneration


def test_truncated_is_weight_by_hand():
    old = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)]])
    sampler = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.8)]])
    w = truncated_is_weight(old, sampler, cap=1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.0, 0.25]]))  # 2.0 truncated to the cap


def test_behavior_weight_scales_the_surrogate_only():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old, ref = logp.detach().clone(), torch.tensor([[-1.5, -1.0]])
    adv, mask = torch.tensor([2.0]), torch.ones(1, 2)
    weight = torch.tensor([[0.5, 2.0]])
    cfg = RLConfig(kl_beta=0.1).loss_config(max_new_tokens=2)
    plain = grpo_loss(LossInputs(logp, old, adv, mask, ref_logp=ref), cfg)
    ones = grpo_loss(LossInputs(logp, old, adv, mask, ref_logp=ref, is_weight=torch.ones(1, 2)), cfg)
    assert float(ones.loss.detach()) == float(plain.loss.detach())
    weighted = grpo_loss(LossInputs(logp, old, adv, mask, ref_logp=ref, is_weight=weight), cfg)
    # ratio = 1: surrogate_t = A = 2 on both tokens; k3 per token from ref - logp = (-0.5, 1.0).
    k3 = [math.exp(d) - d - 1 for d in (-0.5, 1.0)]
    expected = (-(0.5 * 2) + 0.1 * k3[0] + -(2.0 * 2) + 0.1 * k3[1]) / 2
    assert float(weighted.loss.detach()) == pytest.approx(expected, rel=1e-6)
    (grad,) = torch.autograd.grad(weighted.loss, logp)
    # d/dlogp of -w * ratio * A = -w * A (at ratio 1); of beta * k3 = beta * (1 - exp(ref - logp)).
    expected_grad = [(-w * 2 + 0.1 * (1 - math.exp(d))) / 2 for w, d in ((0.5, -0.5), (2.0, 1.0))]
    torch.testing.assert_close(grad, torch.tensor([expected_grad]))


class FakeEngines:
    """generate_scored stamps the version it was told by the test (the engines' weights) and records the order."""

    def __init__(self, fail_at_call: int = -1, replace_at_call: int = -1) -> None:
        self.weights_version, self.calls, self.fail_at_call = 0, [], fail_at_call
        self.replace_at_call = replace_at_call
        self.lock = threading.Lock()
        self.defer_resync, self.resync_pending, self.on_replace, self.resyncs = False, False, None, []

    def generate_scored(self, prompts, spec, pool):
        with self.lock:
            self.calls.append((spec.seed, self.weights_version))
            if len(self.calls) - 1 == self.replace_at_call:  # an engine replaced mid-rollout (as EngineGroup does)
                self.weights_version = -1  # the fresh engine has not had the learner's weights
                if self.defer_resync:
                    self.resync_pending = True
                else:
                    self.on_replace()
            if len(self.calls) - 1 == self.fail_at_call:
                raise EngineFailure("engine 0 died (test)")
            completion = Completion((1,), f"seed {spec.seed}", (-0.1,), ((-0.1,),), (0,), "stop",
                                    self.weights_version)
            scored = [ScoredGeneration(p, Generation(i, p.token_ids, (completion, completion), 8),
                                       (RewardBreakdown(), RewardBreakdown())) for i, p in enumerate(prompts)]
            return ScoredBatch(scored, generate_s=0.01, reward_wait_s=0.0)


class FakeSync:
    def __init__(self, engines: FakeEngines) -> None:
        self.engines, self.pushed = engines, []

    def push(self, version):
        self.engines.weights_version = version
        self.pushed.append(("push", version))
        return version

    def bump(self, version):
        self.engines.weights_version = version
        self.pushed.append(("bump", version))
        return version


PROMPTS = [Prompt(f"ex{i}", (i, i + 1), Action("terminate")) for i in range(5)]


def _stream(engines, async_level, total=4, local=True, pending=None, version=0, sampler=None):
    return RolloutStream(engines, pool=None, sampler=sampler or PromptSampler(len(PROMPTS), 2, seed=0),
                         prompts=PROMPTS, spec_for=lambda t: SamplingSpec(n=2, temperature=1.0, seed=t),
                         async_level=async_level, total_steps=total, local=local, version=version, pending=pending)


@pytest.mark.parametrize("local", [True, False])
def test_one_step_off_order_and_versions(local):
    engines = FakeEngines()
    sync, stream = FakeSync(engines), _stream(engines, 1, local=local)
    lags = []
    for step in range(1, 5):
        rollout = stream.take(step)
        assert rollout.step == step and rollout.before.step == step - 1
        assert {c.policy_version for s in rollout.batch.scored for c in s.generation.completions} == {rollout.version}
        lags.append(step - 1 - rollout.version)
        stream.push(sync, step, changed=step != 3)  # step 3's update "skipped": only the version moves
    stream.close()
    assert lags == [0, 1, 1, 1]
    # Step t+1 is generated (seed t+1) by the weights of step t-1, before step t's push.
    assert engines.calls == [(1, 0), (2, 0), (3, 1), (4, 2)]
    assert sync.pushed == [("push", 1), ("push", 2), ("bump", 3), ("push", 4)]


def test_synchronous_stream_has_no_lag_and_nothing_pending():
    engines = FakeEngines()
    sync, stream = FakeSync(engines), _stream(engines, 0)
    for step in range(1, 4):
        rollout = stream.take(step)
        assert rollout.version == step - 1
        assert stream.pending_bytes() is None
        stream.push(sync, step, changed=True)
    assert engines.calls == [(1, 0), (2, 1), (3, 2)]


def test_pending_rollout_survives_a_checkpoint_and_draws_continue():
    engines = FakeEngines()
    sync, sampler = FakeSync(engines), PromptSampler(len(PROMPTS), 2, seed=0)
    stream = _stream(engines, 1, sampler=sampler)
    first = [stream.take(1)]
    stream.push(sync, 1, changed=True)
    first.append(stream.take(2))
    stream.push(sync, 2, changed=True)
    saved, cursor = stream.pending_bytes(), sampler.cursor  # what a checkpoint after step 2 holds
    later = [stream.take(3).prompts, stream.take(4).prompts]

    engines2 = FakeEngines()
    engines2.weights_version = 2  # a resumed run pushes the checkpoint's weights first
    resumed = _stream(engines2, 1, pending=load_pending(saved), version=2,
                      sampler=PromptSampler(len(PROMPTS), 2, seed=0, cursor=cursor))
    r3 = resumed.take(3)
    assert r3.version == 1 and r3.batch == load_pending(saved).batch  # the very samples, not regenerated
    assert engines2.calls == [(4, 2)]  # only step 4 is generated, by the weights of step 2
    assert [r3.prompts, resumed.take(4).prompts] == later

    # Resumed with rl.async_level=0: the saved rollout is not used; step 3 is generated again by step 2's weights.
    engines3 = FakeEngines()
    engines3.weights_version = 2
    synchronous = _stream(engines3, 0, pending=load_pending(saved), version=2,
                          sampler=PromptSampler(len(PROMPTS), 2, seed=0, cursor=cursor))
    r3 = synchronous.take(3)
    assert r3.version == 2 and engines3.calls == [(3, 2)] and r3.prompts == later[0]


def test_a_failed_generation_is_raised_at_the_push_with_the_state_to_keep():
    engines = FakeEngines(fail_at_call=2)  # step 3's rollout, made during step 2's update
    sync, stream = FakeSync(engines), _stream(engines, 1, local=False)
    stream.take(1)
    stream.push(sync, 1, changed=True)
    stream.take(2)
    with pytest.raises(EngineFailure):
        stream.push(sync, 2, changed=True)
    assert sync.pushed == [("push", 1)]  # step 2's weights never reached the engines
    assert stream.last_before.step == 2  # the checkpoint keeps step 2's update, and step 3's prompts come again
    stream.close()


def test_a_lag_beyond_async_level_stops_the_run():
    from shop_r1.checkpoint import TrainState
    from shop_r1.config import Config
    from shop_r1.distributed.rollouts import StepRollout
    from shop_r1.rollout.records import PolicyVersionMismatch
    from shop_r1.train import checked_rollout

    engines = FakeEngines()
    batch = engines.generate_scored(PROMPTS[:2], SamplingSpec(n=2, temperature=1.0, seed=3), None)  # version 0
    cfg = Config()
    cfg.rl.async_level = 1
    assert checked_rollout(StepRollout(2, PROMPTS[:2], batch, 0, TrainState(1, 0, 0, {})), cfg)  # lag 1: fine
    with pytest.raises(PolicyVersionMismatch, match="a lag of 2 steps, rl.async_level=1 allows at most 1"):
        checked_rollout(StepRollout(3, PROMPTS[:2], batch, 0, TrainState(2, 0, 0, {})), cfg)
    cfg.rl.async_level = 0
    with pytest.raises(PolicyVersionMismatch, match="a lag of 1 steps"):
        checked_rollout(StepRollout(2, PROMPTS[:2], batch, 0, TrainState(1, 0, 0, {})), cfg)
    with pytest.raises(PolicyVersionMismatch, match="policy versions"):  # stamps other than the version pushed
        checked_rollout(StepRollout(1, PROMPTS[:2], batch, 5, TrainState(0, 0, 0, {})), cfg)


def test_an_engine_replaced_during_the_overlap_is_resynced_after_the_update_and_the_rollout_made_again():
    engines = FakeEngines(replace_at_call=2)  # step 3's rollout, made beside step 2's update
    sync = FakeSync(engines)
    engines.on_replace = lambda: engines.resyncs.append(engines.weights_version) or sync.push(sync.pushed[-1][1])
    stream = _stream(engines, 1, local=False)
    stream.take(1)
    stream.push(sync, 1, changed=True)
    stream.take(2)
    assert engines.resyncs == []  # nothing pushed from the rollout thread while the learner worked
    stream.push(sync, 2, changed=True)
    assert engines.resyncs == [-1] and engines.resync_pending is False and engines.defer_resync is False
    r3 = stream.take(3)
    # Regenerated after the push, by one set of weights (step 2's): lag 0 for this step.
    assert r3.version == 2 and engines.calls[-2:] == [(3, 1), (3, 2)]
    assert {c.policy_version for s in r3.batch.scored for c in s.generation.completions} == {2}
    stream.close()


class FakeLearners:
    def __init__(self) -> None:
        self.saved = []

    def save_checkpoint(self, ckpt_dir, client_state):
        import os

        os.makedirs(ckpt_dir, exist_ok=True)
        self.saved.append(client_state["step"])

    def nonfinite_weights(self):
        return []


def test_a_failure_after_the_update_checkpoints_the_learners_step(tmp_path):
    from shop_r1 import checkpoint
    from shop_r1.config import Config
    from shop_r1.train import _checkpoint_on_failure

    # Synchronous: step 1's rollout taken, the learner updated, then the push failed for good.
    engines, learners = FakeEngines(), FakeLearners()
    sampler = PromptSampler(len(PROMPTS), 2, seed=0)
    stream = _stream(engines, 0, sampler=sampler)
    stream.take(1)
    _checkpoint_on_failure(Config(), tmp_path / "a", learners, stream, sampler, learner_step=1)
    state = checkpoint.load_state(checkpoint.latest(tmp_path / "a"))
    assert learners.saved == [1] and state.step == 1
    assert (state.cursor_epoch, state.cursor_position) == (sampler.cursor.epoch, sampler.cursor.position)

    # One-step-off: step 2's update applied, step 3's rollout (in flight) failed: step 2, cursor before step 3.
    engines, learners = FakeEngines(fail_at_call=2), FakeLearners()
    sampler = PromptSampler(len(PROMPTS), 2, seed=0)
    stream, sync = _stream(engines, 1, sampler=sampler, local=False), FakeSync(engines)
    stream.take(1)
    stream.push(sync, 1, changed=True)
    stream.take(2)
    with pytest.raises(EngineFailure):
        stream.push(sync, 2, changed=True)
    _checkpoint_on_failure(Config(), tmp_path / "b", learners, stream, sampler, learner_step=2)
    state = checkpoint.load_state(checkpoint.latest(tmp_path / "b"))
    assert state.step == 2 and (state.cursor_epoch, state.cursor_position) == (
        stream.last_before.cursor_epoch, stream.last_before.cursor_position)
    assert not (checkpoint.latest(tmp_path / "b") / "pending_rollout.json").exists()
    stream.close()


class SlowEngines(FakeEngines):
    """Generation that takes `generate_s` of wall time (a sleep: no CPU, so it measures the overlap itself)."""

    def __init__(self, generate_s: float) -> None:
        super().__init__()
        self.generate_s = generate_s

    def generate_scored(self, prompts, spec, pool):
        time.sleep(self.generate_s)
        return super().generate_scored(prompts, spec, pool)


class SlowSync(FakeSync):
    def __init__(self, engines, sync_s: float) -> None:
        super().__init__(engines)
        self.sync_s = sync_s

    def push(self, version):
        time.sleep(self.sync_s)
        return super().push(version)


@pytest.mark.parametrize("generate_s,update_s", [(0.3, 0.15), (0.15, 0.3)])
def test_one_step_off_steps_take_the_slower_stage_plus_the_sync(generate_s, update_s):
    # The driver's loop shape (train.py): take the rollout, update, push. Synchronous: every step costs
    # generate + update + sync. One step off: after the first step, generation of step t+1 runs beside step t's
    # update, so a step costs max(generate, update) + sync (the push waits for the generation in flight).
    sync_s, steps = 0.05, 6

    def run(async_level):
        engines = SlowEngines(generate_s)
        sync, stream = SlowSync(engines, sync_s), _stream(engines, async_level, total=steps, local=False)
        marks = [time.perf_counter()]
        for step in range(1, steps + 1):
            stream.take(step)
            time.sleep(update_s)  # the learner's update
            stream.push(sync, step, changed=True)
            marks.append(time.perf_counter())
        stream.close()
        return [b - a for a, b in zip(marks, marks[1:])]

    sync_steps, async_steps = run(0), run(1)
    serial = generate_s + update_s + sync_s
    overlapped = max(generate_s, update_s) + sync_s
    assert min(sync_steps) >= serial * 0.95
    # Steady state (steps 2 .. n-1; the last step starts no generation, so it costs update + sync): within 40 ms of
    # max(generate, update) + sync, and well under the serial cost.
    for t in async_steps[1:-1]:
        assert overlapped * 0.95 <= t <= overlapped + 0.04, (async_steps, overlapped)
    assert async_steps[-1] == pytest.approx(update_s + sync_s, abs=0.04)
    assert sum(async_steps[1:-1]) < 0.8 * sum(sync_steps[1:-1])
