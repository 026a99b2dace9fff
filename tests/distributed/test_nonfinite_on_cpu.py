"""Numbers stay finite in a real GRPO run (vLLM engine, reward pool, DeepSpeed learner on CPU): an injected NaN reward
and an injected inf logit each skip their step's update (no optimizer step, counted by cause), the run goes on; too
many in a row stop it with an error and a checkpoint of finite weights."""

import glob
import json
import math

import pytest
import torch
from transformers import AutoTokenizer

from shop_r1.algo.finite import NonFiniteError
from shop_r1.learner.rank import LearnerRank
from shop_r1.train import run_grpo
from tests.distributed.test_grpo_on_cpu import _cfg, _register_by_value, engines, prompts  # noqa: F401


def nan_on_terminate(response, target, cfg, logprobs):
    """variety reward, except NaN for every response to a `terminate` target (an injected broken reward)."""
    from shop_r1.types import RewardBreakdown

    value = math.nan if target.type == "terminate" else len(set(response)) / (len(response) + 1)
    return RewardBreakdown(value=value, total=value, format_valid=True)


class InfLogitLearner(LearnerRank):
    """From its `inf_from`-th GRPO update on, one logit of the policy's LM head is +inf (an injected overflow)."""

    inf_from = 2

    def grpo_step(self, batch, rl):
        self.updates = getattr(self, "updates", 0) + 1
        if self.updates < self.inf_from:
            return super().grpo_step(batch, rl)

        def poison(module, args, out):
            out = out.clone()
            out[..., 0] = math.inf
            return out

        handle = self.backend.engine.module.lm_head.register_forward_hook(poison)
        try:
            return super().grpo_step(batch, rl)
        finally:
            handle.remove()


def _ckpt_weights(ckpt):
    (path,) = glob.glob(str(ckpt / "deepspeed" / "*" / "mp_rank_00_model_states.pt"))
    return torch.load(path, map_location="cpu", weights_only=False)["module"]


def _targets(prompts):  # noqa: F811
    return {p.example_id: p.target.type for p in prompts}


@pytest.mark.timeout(900)
def test_nan_reward_and_inf_logit_skip_their_updates_and_the_run_goes_on(ray_local_cluster, tiny_model_dir,
                                                                          prompts, engines, tmp_path):  # noqa: F811
    import sys

    import ray.cloudpickle

    _register_by_value()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    cfg = _cfg(tmp_path / "run", 5)
    cfg.rl.keep_checkpoints, cfg.rl.max_nonfinite_steps = 10, 10
    InfLogitLearner.inf_from = 2
    result = run_grpo(cfg, str(tiny_model_dir), prompts, tmp_path / "run" / "rl", local=False, pad_id=pad,
                      score_fn=nan_on_terminate, learner_cls=InfLogitLearner, engines=engines)
    assert result.num_steps == 5
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics_grpo.jsonl").read_text().splitlines()]
    batches = [json.loads(x) for x in (tmp_path / "run" / "rl" / "batches.jsonl").read_text().splitlines()]
    types = _targets(prompts)
    learner_calls, expected = 0, []
    for b in batches:  # what each step must report: the reward's NaN first, else the learner's 2nd+ update
        if any(types[e] == "terminate" for e in b["example_ids"]):
            expected.append("reward")
        else:
            learner_calls += 1
            expected.append("loss" if learner_calls >= 2 else "")
    assert {"reward", "loss", ""} <= set(expected), expected  # the seed gives every case at least once
    ckpts = tmp_path / "run" / "rl" / "checkpoints"
    for r, cause in zip(logged, expected):
        assert r["train/skipped_update"] == float(bool(cause))
        for c in ("reward", "loss"):
            assert r[f"train/nonfinite_{c}"] == float(cause == c), (r["step"], c)
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
        if r["step"] > 1:  # a skipped update leaves the weights exactly as they were; a real one moves them
            before, after = _ckpt_weights(ckpts / f"step_{r['step'] - 1:06d}"), _ckpt_weights(
                ckpts / f"step_{r['step']:06d}")
            same = all(torch.equal(before[k], after[k]) for k in before)
            assert same == bool(cause), r["step"]
            assert all(torch.isfinite(v).all() for v in after.values())


@pytest.mark.timeout(900)
def test_too_many_nonfinite_steps_in_a_row_stop_with_finite_checkpoints(ray_local_cluster, tiny_model_dir,
                                                                         prompts, engines, tmp_path):  # noqa: F811
    import sys

    import ray.cloudpickle

    _register_by_value()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    cfg = _cfg(tmp_path / "run", 6)
    cfg.rl.max_nonfinite_steps = 2
    InfLogitLearner.inf_from = 2
    from tests.distributed.test_grpo_on_cpu import variety_reward

    with pytest.raises(NonFiniteError) as err:
        run_grpo(cfg, str(tiny_model_dir), prompts, tmp_path / "run" / "rl", local=False, pad_id=pad,
                 score_fn=variety_reward, learner_cls=InfLogitLearner, engines=engines)
    assert "step 2: loss, step 3: loss" in str(err.value) and "rl.max_nonfinite_steps=2" in str(err.value)
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics_grpo.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3]  # the stopping step is logged before the error
    ckpts = tmp_path / "run" / "rl" / "checkpoints"
    assert (ckpts / "latest").read_text() == "step_000002"  # step 3 raised before its checkpoint
    w1, w2 = _ckpt_weights(ckpts / "step_000001"), _ckpt_weights(ckpts / "step_000002")
    assert all(torch.equal(w1[k], w2[k]) and torch.isfinite(w2[k]).all() for k in w1)
