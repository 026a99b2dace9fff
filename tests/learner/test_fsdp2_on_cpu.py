"""The FSDP2 learner (learner.backend=fsdp2) on CPU (gloo), in this process: from the same weights on the same batch
its update is DeepSpeed ZeRO-0's (the seam's proof: one GRPO step, two backends), a checkpoint resumes to the same
next step, the weights it hands on are the HF model's, and a non-finite step changes nothing."""

import dataclasses
import threading

import pytest
import torch

from shop_r1.config import ConfigError, LearnerConfig, RLConfig, load_config
from shop_r1.learner.rank import LearnerRank
from shop_r1.learner.sft_step import empty_micro_batch, token_loss_sum
from tests.algo.test_shared_prompt_on_cpu import _grouped_batch


def _loss_cfg():
    return RLConfig(kl_beta=0.1).loss_config(max_new_tokens=16)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.mark.timeout(600)
def test_grpo_and_sft_updates_equal_deepspeed_zero0(tiny_model_dir, tiny_tokenizer):
    """Two GRPO steps (several micro-batches, KL to a reference, clipping on: the norm is ~5 > grad_clip) and one
    SFT step, from the same weights: the same figures and the same weights to 1e-6."""
    from shop_r1.data.examples import build_sft_examples
    from shop_r1.data.synth import synthesize_sessions
    from shop_r1.learner.sft_data import pack_micro_batches, tokenize_sft_examples

    # The same forward on both (FSDP2 runs no last layer at the targets: its layers are shards), so the figures
    # agree to the last digits; that path's own equality to the full forward: tests/learner/test_target_states_*.py.
    cfg = LearnerConfig(zero_stage=0, max_tokens_per_micro_batch=24, last_layer_at_targets=False)
    learners = [LearnerRank(str(tiny_model_dir), dataclasses.replace(cfg, backend=backend), lr=1e-3, total_steps=3,
                            warmup_steps=1, lr_schedule="cosine", reference_path=str(tiny_model_dir))
                for backend in ("deepspeed", "fsdp2")]
    stats = [[m.grpo_step(_grouped_batch(seed), _loss_cfg()) for seed in (1, 2)] for m in learners]
    for ds, fsdp in zip(*stats):
        assert fsdp.num_tokens == ds.num_tokens and fsdp.grad_norm > cfg.grad_clip
        assert fsdp.loss == pytest.approx(ds.loss, rel=1e-6, abs=1e-9)
        assert fsdp.grad_norm == pytest.approx(ds.grad_norm, rel=1e-6)
        assert fsdp.kl == pytest.approx(ds.kl, rel=1e-5, abs=1e-10)
    assert _max_diff(*(dict(m.named_weights()) for m in learners)) < 1e-6

    examples = build_sft_examples(synthesize_sessions(2, seed=3)).examples
    mbs = pack_micro_batches(tokenize_sft_examples(examples, tiny_tokenizer, 4096).sequences, 2048)
    n = sum(mb.num_loss_tokens for mb in mbs)
    ds, fsdp = (m.sft_step(mbs, n) for m in learners)
    assert fsdp.loss == pytest.approx(ds.loss, rel=1e-6) and fsdp.grad_norm == pytest.approx(ds.grad_norm, rel=1e-6)
    assert fsdp.lr == ds.lr and fsdp.step == ds.step == 3
    assert _max_diff(*(dict(m.named_weights()) for m in learners)) < 1e-6
    assert learners[1].eval_loss(mbs) == pytest.approx(learners[0].eval_loss(mbs), rel=1e-6)


@pytest.mark.timeout(600)
def test_checkpoint_resumes_weights_optimizer_and_schedule_exactly(tiny_model_dir, tmp_path):
    """A learner that loads step 1's checkpoint makes step 2 exactly as the saver did (a warmup-then-cosine schedule,
    so a lost schedule or AdamW state shows); loading a checkpoint saved before any step gives a fresh learner's step
    (AdamW's state stays empty, though DCP fills it to save)."""
    def make():
        return LearnerRank(str(tiny_model_dir), LearnerConfig(backend="fsdp2", max_tokens_per_micro_batch=24),
                           lr=1e-3, total_steps=4, warmup_steps=1, lr_schedule="cosine",
                           reference_path=str(tiny_model_dir))

    a = make()
    a.save_checkpoint(str(tmp_path / "fresh"), {"step": 0})
    first = a.grpo_step(_grouped_batch(1), _loss_cfg())
    a.save_checkpoint(str(tmp_path / "one"), {"step": 1, "cursor": 7})
    second = a.grpo_step(_grouped_batch(2), _loss_cfg())
    weights = dict(a.named_weights())

    b = make()
    assert b.load_checkpoint(str(tmp_path / "one")) == {"step": 1, "cursor": 7, "learner_step": 1} and b.step == 1
    assert b.grpo_step(_grouped_batch(2), _loss_cfg()) == second
    assert _max_diff(dict(b.named_weights()), weights) == 0.0
    assert b.scheduler.get_last_lr() == a.scheduler.get_last_lr()

    b.load_checkpoint(str(tmp_path / "fresh"))
    assert b.step == 0 and not b.backend.optimizer.state
    assert b.grpo_step(_grouped_batch(1), _loss_cfg()) == first
    with pytest.raises(FileNotFoundError, match="no FSDP2 checkpoint"):
        b.load_checkpoint(str(tmp_path / "nothing"))


@pytest.mark.timeout(600)
def test_weights_handed_on_are_the_hf_models(tiny_model_dir, tmp_path):
    """After a step: named_weights (parameters only, the tied embedding once), the manifest and the broadcast carry
    the trained tensors, and the saved HF folder scores the batch as the learner does."""
    from transformers import AutoModelForCausalLM

    from shop_r1.learner.forward import Forward
    from shop_r1.weight_sync.broadcast import SyncGroupSpec, WeightReceiver, fusion_order

    learner = LearnerRank(str(tiny_model_dir), LearnerConfig(backend="fsdp2"), lr=1e-2, total_steps=1)
    batch = _grouped_batch(1)
    learner.grpo_step(batch, _loss_cfg())
    weights = dict(learner.named_weights())
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert list(weights) == [n for n, _ in base.named_parameters()]  # lm_head.weight is tied: not listed
    assert _max_diff(weights, {n: p.detach() for n, p in base.named_parameters()}) > 1e-3  # the step changed them

    learner.save_hf(str(tmp_path / "hf"))
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert _max_diff(weights, {n: p.detach() for n, p in saved.named_parameters()}) == 0.0
    with torch.no_grad():
        theirs = Forward(torch.device("cpu"), shared_prompt=False).completion_logprobs(saved, batch)
    ours = learner.probe_logprobs(batch)
    mask = batch.completion_mask.bool()
    assert [len(r) for r in ours] == mask.sum(dim=1).tolist()
    torch.testing.assert_close(torch.tensor([x for r in ours for x in r]), theirs[mask], atol=1e-5, rtol=1e-5)

    manifest = learner.weight_manifest(bucket_bytes=1 << 20)
    # every weight once, in the layout vLLM fuses (q/k/v and gate/up parts adjacent: the in-place load)
    assert [(m.name, m.shape) for b in manifest.buckets for m in b] == [(n, tuple(weights[n].shape))
                                                                        for n in fusion_order(weights)]
    host, port = learner.open_weight_sync_store(timeout_s=60)
    spec = SyncGroupSpec(host, port, world_size=2, timeout_s=60)
    got: dict = {}

    def receive() -> None:
        receiver = WeightReceiver(spec, 1, torch.device("cpu"))
        got.update((n, t.clone()) for n, t in receiver.receive(manifest))

    thread = threading.Thread(target=receive)
    thread.start()
    learner.init_weight_sender(spec)
    assert learner.broadcast_weights(manifest) == manifest.num_bytes
    thread.join(timeout=60)
    assert _max_diff(got, weights) == 0.0


@pytest.mark.timeout(600)
def test_a_nonfinite_step_changes_nothing(tiny_model_dir):
    """An infinite gradient (cause "grad_norm") and a NaN loss (cause "loss"): no step, the gradients dropped,
    AdamW and the schedule as they were; the next finite step trains."""
    learner = LearnerRank(str(tiny_model_dir), LearnerConfig(backend="fsdp2"), lr=1e-2, total_steps=3)
    before = dict(learner.named_weights())
    learner.backward(token_loss_sum(learner, empty_micro_batch()))  # no loss tokens: a zero gradient on every parameter
    param = next(learner.backend.module.parameters())
    param.grad.to_local().fill_(float("inf"))
    assert learner.optimizer_step([0.5]).nonfinite == "grad_norm"
    assert learner.optimizer_step([float("nan")]).nonfinite == "loss"
    assert all(p.grad is None for p in learner.backend.module.parameters())
    assert not learner.backend.optimizer.state and learner.scheduler.last_epoch == 0
    assert _max_diff(dict(learner.named_weights()), before) == 0.0
    done = learner.grpo_step(_grouped_batch(1), _loss_cfg())
    assert not done.nonfinite and _max_diff(dict(learner.named_weights()), before) > 1e-3


def test_zero_cpu_offload_is_refused_naming_the_key():
    # The config's rule (shop_r1/config/learner.py), said when the config loads, before any rank starts.
    with pytest.raises(ConfigError, match="learner.offload_optimizer is DeepSpeed ZeRO's CPU offload"):
        load_config(None, ["learner.backend=fsdp2", "learner.offload_optimizer=true"])
    load_config(None, ["learner.backend=deepspeed", "learner.offload_optimizer=true"])
