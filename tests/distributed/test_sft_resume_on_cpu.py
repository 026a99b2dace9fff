"""SFT resumes exactly: a learner rank killed mid-run (SIGKILL, as by the OOM killer) is replaced and SFT continues from
its last checkpoint in the same process; the next batch, the final weights and the metrics equal an uninterrupted
run's, every step logged once (after the readers' de-duplication)."""

import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from shop_r1.config import load_config
from shop_r1.data.build import build_datasets
from shop_r1.data.sessions import write_sessions
from shop_r1.data.synth import synthesize_sessions
from shop_r1.learner.rank import LearnerRank
from shop_r1.sft import run_sft


class DyingSFTLearner(LearnerRank):
    """SIGKILLs its own process at the start of its third SFT step, once per test (the marker file)."""

    marker = ""

    def sft_step(self, micro_batches, num_loss_tokens_global):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 3:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().sft_step(micro_batches, num_loss_tokens_global)


def _cfg(run_dir):
    return load_config(None, [f"run_dir={run_dir}", "data.max_prompt_tokens=1500", "data.test_fraction=0.25",
                              "sft.epochs=2", "sft.lr=3e-3", "sft.global_batch_size=4", "sft.max_seq_len=3000",
                              "sft.checkpoint_every=2", "sft.max_restarts=1", "sft.lr_schedule=cosine",
                              "logging.wandb=false"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_sft_learner_resumes_from_its_checkpoint_exactly(ray_local_cluster, tiny_model_dir, tmp_path, capsys):
    import sys

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    data = tmp_path / "data"
    write_sessions(synthesize_sessions(10, seed=4), tmp_path / "sessions.jsonl")
    built = build_datasets(tmp_path / "sessions.jsonl", data, tiny_model_dir, _cfg(tmp_path).data, seed=0)

    full = run_sft(_cfg(tmp_path / "a"), str(tiny_model_dir), built.sft_train_path, tmp_path / "a" / "sft",
                   local=False)
    assert full.num_steps == 4  # 7-8 train sessions / batch 4 = 2 steps per epoch, 2 epochs

    DyingSFTLearner.marker = str(tmp_path / "died")
    resumed = run_sft(_cfg(tmp_path / "b"), str(tiny_model_dir), built.sft_train_path, tmp_path / "b" / "sft",
                      local=False, learner_cls=DyingSFTLearner)
    assert os.path.exists(DyingSFTLearner.marker)  # it did die, in step 3
    out = capsys.readouterr().out
    assert "resuming from the last checkpoint (restart 1 of at most 1)" in out
    assert "SFT resumed from" in out and "step_000002 (step 2)" in out
    assert resumed.num_steps == 4
    wa, wb = load_file(f"{full.hf_dir}/model.safetensors"), load_file(f"{resumed.hf_dir}/model.safetensors")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-6, rtol=1e-5, msg=k)  # the same weights
    la = [json.loads(x) for x in (tmp_path / "a" / "metrics_sft.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (tmp_path / "b" / "metrics_sft.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lb] == [1, 2, 3, 4]  # step 3 died before its log line; it ran once more
    for a, b in zip(la, lb):
        assert b["sft/loss"] == pytest.approx(a["sft/loss"], rel=1e-5) and b["sft/lr"] == pytest.approx(a["sft/lr"])
        assert b["sft/skipped_update"] == 0.0
    # The mid-run checkpoints are of the current timeline only; the final state is in sft/checkpoint.
    ckpts = sorted(p.name for p in (tmp_path / "b" / "sft" / "checkpoints").iterdir() if p.name.startswith("step"))
    assert ckpts == ["step_000002"]
