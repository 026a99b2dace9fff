"""The DeepSpeed learner on CPU (gloo), in this process (before any in-process vLLM engine of a later test module,
which registers process groups of its own): SFT lowers the loss, the split of a batch does not change the update,
the saved HF folder reproduces the model, checkpoints round-trip. The trained-learner tests run on each backend
(learner.backend; FSDP2's own: tests/learner/test_fsdp2_on_cpu.py)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from shop_r1.config import LearnerConfig
from shop_r1.data.examples import build_sft_examples
from shop_r1.data.synth import synthesize_sessions
from shop_r1.learner.rank import LearnerRank
from shop_r1.learner.sft_data import pack_micro_batches, tokenize_sft_examples


@pytest.fixture(scope="module")
def sequences(tiny_tokenizer):
    examples = build_sft_examples(synthesize_sessions(6, seed=3)).examples
    return tokenize_sft_examples(examples, tiny_tokenizer, 4096).sequences


def _module(learner):
    """The whole HF model (FSDP2's root module runs as one)."""
    return learner.backend.engine.module if learner.cfg.backend == "deepspeed" else learner.backend.module


@pytest.fixture(scope="module", params=["deepspeed", "fsdp2"])
def trained(tiny_model_dir, sequences, request):
    learner = LearnerRank(str(tiny_model_dir), LearnerConfig(backend=request.param, zero_stage=2), lr=3e-3,
                          total_steps=6)
    mbs = pack_micro_batches(sequences, 8192)
    n = sum(mb.num_loss_tokens for mb in mbs)
    losses = [learner.sft_step(mbs, n).loss for _ in range(6)]
    return learner, losses


def test_sft_steps_lower_the_loss(trained):
    _, losses = trained
    # A random model starts near ln(vocab) ~ 7.5; six full-batch steps at 3e-3 must cut it clearly.
    assert losses[0] > 6.0
    assert losses[-1] < losses[0] - 0.5, losses


@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_micro_batch_split_gives_the_same_update(tiny_model_dir, sequences, zero_stage):
    """Under ZeRO-2/3 the gradient of a step split into micro-batches used to be the last micro-batches' only (the
    learner bypasses the engine's forward, where ZeRO counts micro-batches): grad norm 3.29 instead of 3.63."""
    whole = pack_micro_batches(sequences, 10**6)
    split = pack_micro_batches(sequences, 1)  # one sequence per micro-batch
    assert len(whole) == 1 and len(split) == len(sequences)
    n = whole[0].num_loss_tokens
    a = LearnerRank(str(tiny_model_dir), LearnerConfig(zero_stage=zero_stage), lr=1e-3, total_steps=1)
    b = LearnerRank(str(tiny_model_dir), LearnerConfig(zero_stage=zero_stage), lr=1e-3, total_steps=1)
    sa, sb = a.sft_step(whole, n), b.sft_step(split, n)
    assert sa.loss == pytest.approx(sb.loss, rel=1e-5)
    assert sa.grad_norm == pytest.approx(sb.grad_norm, rel=1e-4)
    # Adam's first step is ~lr * sign(grad), so entries whose gradient is ~0 may differ by float summation order;
    # the models must nonetheless agree on the loss after the step.
    assert a.eval_loss(whole) == pytest.approx(b.eval_loss(whole), rel=1e-4)
    assert a.eval_loss(whole) < sa.loss


@pytest.mark.timeout(600)
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_grpo_micro_batch_split_gives_the_same_update(tiny_model_dir, zero_stage):
    """One GRPO batch as one micro-batch and as several: the same loss, gradient norm and weights after the step
    (before the fix, ZeRO-2/3 kept only part of the micro-batches' gradients: weights off by 2 x lr)."""
    from shop_r1.config import RLConfig
    from shop_r1.learner.grpo_step import micro_batches
    from tests.algo.test_shared_prompt_on_cpu import _grouped_batch

    batch = _grouped_batch(1)
    stats, weights = [], []
    for budget in (10**6, 24):
        learner = LearnerRank(str(tiny_model_dir), LearnerConfig(zero_stage=zero_stage, grad_clip=1e9,
                                                                 max_tokens_per_micro_batch=budget),
                              lr=1e-2, total_steps=1, reference_path=str(tiny_model_dir))
        assert len(micro_batches(learner, batch)) == (1 if budget > 10**5 else 3)
        stats.append(learner.grpo_step(batch, RLConfig(kl_beta=0.1).loss_config(max_new_tokens=16)))
        weights.append(dict(learner.named_weights()))
    assert stats[1].loss == pytest.approx(stats[0].loss, rel=1e-5, abs=1e-8)
    assert stats[1].grad_norm == pytest.approx(stats[0].grad_norm, rel=1e-5)
    # Adam's first step moves every weight by ~lr * sign(grad): a lost share of the gradient flips signs (2 x lr).
    assert max(float((weights[1][n] - weights[0][n]).abs().max()) for n in weights[0]) < 1e-3


def test_save_hf_reproduces_the_trained_model(trained, tmp_path, tiny_model_dir):
    learner, _ = trained
    learner.save_hf(str(tmp_path / "hf"))
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        ours = _module(learner)(ids).logits
        theirs = saved(ids).logits
        before = base(ids).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(theirs, before, atol=1e-3)  # training really changed it
    assert (tmp_path / "hf" / "tokenizer.json").exists() and (tmp_path / "hf" / "chat_template.jinja").exists()


def test_checkpoint_round_trip(trained, tmp_path, tiny_model_dir):
    learner, _ = trained
    learner.save_checkpoint(str(tmp_path / "ckpt"), {"epoch": 2, "data_cursor": 17})
    fresh = LearnerRank(str(tiny_model_dir), learner.cfg, lr=3e-3, total_steps=6)
    state = fresh.load_checkpoint(str(tmp_path / "ckpt"))
    assert state["epoch"] == 2 and state["data_cursor"] == 17 and fresh.step == learner.step
    for (name, pa), (_, pb) in zip(learner.named_weights(), fresh.named_weights()):
        torch.testing.assert_close(pa, pb, msg=name)
    with pytest.raises(FileNotFoundError):
        fresh.load_checkpoint(str(tmp_path / "nothing"))


def test_exact_self_certainty_from_learner_logits(trained):
    from shop_r1.algo.batch import GRPOBatch
    from shop_r1.reward.self_certainty import kl_to_uniform_logits

    learner, _ = trained
    ids = torch.tensor([[5, 17, 42, 99, 3, 8], [7, 7, 9, 11, 2, 0]])
    rationale = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    batch = GRPOBatch(ids, torch.tensor([[1] * 6, [1] * 5 + [0]]), torch.tensor([[0, 0, 1, 1, 1, 1]] * 2), rationale,
                      torch.zeros(2), torch.zeros(2, 6))
    got = learner.rationale_self_certainty(batch, "p_to_u")
    with torch.no_grad():
        logits = _module(learner)(ids[:1]).logits[0]
    # rationale tokens 2 and 3 are predicted at positions 1 and 2
    expected = float(kl_to_uniform_logits(logits[1:3], "p_to_u").mean())
    assert got[0] == pytest.approx(expected, rel=1e-4) and got[1] == 0.0
    # The paper's 1/|V| (normalize_by_vocab) divides by the logits' width, as the top-k path does.
    normalized = learner.rationale_self_certainty(batch, "p_to_u", normalize_by_vocab=True)
    assert normalized[0] == pytest.approx(expected / logits.shape[-1], rel=1e-4) and normalized[1] == 0.0


@pytest.mark.timeout(300)
def test_a_stale_extension_lock_does_not_stall_a_learner_start(tiny_model_dir, tmp_path):
    """torch's JIT loader waits, forever, for `TORCH_EXTENSIONS_DIR/<op>/lock` to vanish; a process killed while it
    held the lock leaves it behind. A learner never loads DeepSpeed's shm op, so it starts beside a stale lock, and
    nothing is built. In a fresh process: this one's DeepSpeed communication backend already exists. The op is
    buildable here (checked), so without the switch the start would wait on the lock."""
    import os
    import subprocess
    import sys

    ext = tmp_path / "torch_extensions"
    (ext / "deepspeed_shm_comm").mkdir(parents=True)
    (ext / "deepspeed_shm_comm" / "lock").touch()
    code = (
        "from shop_r1.config import LearnerConfig\n"
        "from shop_r1.learner.rank import LearnerRank\n"
        f"m = LearnerRank({str(tiny_model_dir)!r}, LearnerConfig(zero_stage=0), lr=1e-3, total_steps=1)\n"
        "print('started', m.device)\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "print('shm op buildable', get_accelerator().create_op_builder('ShareMemCommBuilder').is_compatible())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(TORCH_EXTENSIONS_DIR=str(ext), DS_ACCELERATOR="cpu")
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the learner did not start within 240 s beside a stale lock in {ext}") from e
    assert out.returncode == 0, out.stderr[-3000:]
    assert "started cpu" in out.stdout and "shm op buildable True" in out.stdout
    assert sorted(p.name for p in ext.rglob("*")) == ["deepspeed_shm_comm", "lock"]  # nothing built, lock untouched
