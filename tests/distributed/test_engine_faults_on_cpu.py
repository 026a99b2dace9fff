"""A rollout engine killed mid-generation: replaced, re-synced to the learner's weights and version, its prompts
requeued, and the run's samples the ones an uninterrupted run draws (seeded sampling)."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from shop_r1.rollout.vllm_engine import VLLMEngine
from shop_r1.train import run_grpo
from tests.distributed.test_grpo_on_cpu import _cfg, _register_by_value, prompts, variety_reward  # noqa: F401

MARKER = "SHOP_R1_TEST_DIE_MARKER"


class DyingEngine(VLLMEngine):
    """Kills its own process (SIGKILL, as the OOM killer would) 0.3 s into its second rollout generate call, once per
    test: the first engine to get there creates the marker file and dies; its replacement and the others live."""

    def generate(self, prompt_token_ids, spec):
        self.rollout_calls = getattr(self, "rollout_calls", 0) + (spec.n > 1)
        if spec.n > 1 and self.rollout_calls == 2:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                threading.Thread(target=lambda: (time.sleep(0.3), os.kill(os.getpid(), signal.SIGKILL)),
                                 daemon=True).start()
                # The call must still be running when the kill lands: a tiny model's generate can finish in under
                # 0.3 s, and then the engine died only after the run's last step (nothing to replace).
                time.sleep(30)
        return super().generate(prompt_token_ids, spec)


def _samples(run_dir: Path) -> list[tuple[int, list[str]]]:
    dumped = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    return [(d["step"], [s["text"] for s in d["samples"]]) for d in dumped]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_killed_engine_is_replaced_resynced_and_its_prompts_requeued(ray_local_cluster, tiny_model_dir, prompts,  # noqa: F811
                                                                     tmp_path, capsys):
    _register_by_value()
    import sys

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    DyingEngine.marker = str(tmp_path / "died")
    pad = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    overrides = dict(num_engines=2, max_engine_restarts=1)
    runs = {}
    for name, engine_cls in (("faulty", DyingEngine), ("clean", None)):
        cfg = _cfg(tmp_path / name, 2)
        for key, value in overrides.items():
            setattr(cfg.rollout, key, value)
        result = run_grpo(cfg, str(tiny_model_dir), prompts, tmp_path / name / "rl", local=False, pad_id=pad,
                          score_fn=variety_reward, engine_cls=engine_cls)
        assert result.num_steps == 2
        runs[name] = [json.loads(line) for line in (tmp_path / name / "metrics_grpo.jsonl").read_text().splitlines()]
    assert Path(DyingEngine.marker).exists()  # an engine did die
    assert "replaced by a fresh engine (restart 1 of at most 1)" in capsys.readouterr().out
    faulty = runs["faulty"]
    assert [r["rollout/engine_restarts"] for r in faulty] == [0, 1]
    for r in faulty:
        # check_weight_sync: after every push all engines report the learner's version, and engine 0 computes
        # the learner's logprobs; the samples were drawn by the version pushed last.
        assert r["weight_sync/check_max_abs_logprob_diff"] < 1e-4 and r["policy_version"] == r["step"] - 1
    # Every sample of the interrupted step is there, and the same as the uninterrupted run's (same seeds).
    got, want = _samples(tmp_path / "faulty"), _samples(tmp_path / "clean")
    assert [s for s, _ in got] == [1, 1, 2, 2] and all(len(texts) == 4 for _, texts in got)
    assert got == want
    assert [r["reward/total"] for r in faulty] == pytest.approx([r["reward/total"] for r in runs["clean"]])
