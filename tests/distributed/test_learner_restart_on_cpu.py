"""A learner rank killed mid-step: the driver tears the actors down and resumes from the last checkpoint in the same
process (rl.max_restarts), and the run finishes every step."""

import json
import os
import signal

import pytest
from transformers import AutoTokenizer

from shop_r1.learner.rank import LearnerRank
from shop_r1.train import run_grpo
from tests.distributed.test_grpo_on_cpu import _cfg, _register_by_value, prompts, variety_reward  # noqa: F401


class DyingLearner(LearnerRank):
    """SIGKILLs its own process at the start of its second GRPO update, once per test (the marker file)."""

    def grpo_step(self, batch, rl):
        self.updates = getattr(self, "updates", 0) + 1
        if self.updates == 2:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().grpo_step(batch, rl)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_killed_learner_resumes_from_the_last_checkpoint(ray_local_cluster, tiny_model_dir, prompts, tmp_path,  # noqa: F811
                                                         capsys):
    _register_by_value()
    import sys

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    DyingLearner.marker = str(tmp_path / "died")
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    cfg = _cfg(tmp_path / "run", 3)
    cfg.rl.max_restarts = 1
    result = run_grpo(cfg, str(tiny_model_dir), prompts, tmp_path / "run" / "rl", local=False, pad_id=pad,
                      score_fn=variety_reward, learner_cls=DyingLearner)
    assert os.path.exists(DyingLearner.marker)  # the learner did die, in step 2's update
    assert "resuming from the last checkpoint (restart 1 of at most 1)" in capsys.readouterr().out
    assert result.num_steps == 3 and (tmp_path / "run" / "rl" / "hf" / "model.safetensors").exists()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics_grpo.jsonl").read_text().splitlines()]
    # Step 2 died before it was logged; the resumed attempt ran it again from the step-1 checkpoint.
    assert [r["step"] for r in logged] == [1, 2, 3]
    assert [r["policy_version"] for r in logged] == [0, 1, 2]
    # With no restarts allowed the same fault ends the run with the actor's error.
    os.remove(DyingLearner.marker)
    cfg = _cfg(tmp_path / "strict", 2)
    cfg.rl.max_restarts = 0
    with pytest.raises(Exception) as err:
        run_grpo(cfg, str(tiny_model_dir), prompts, tmp_path / "strict" / "rl", local=False, pad_id=pad,
                 score_fn=variety_reward, learner_cls=DyingLearner)
    assert "Actor" in type(err.value).__name__ or "actor" in str(err.value)
