"""GRPO pieces on CUDA: the NCCL weight-sync group and a learner GRPO step in bf16 (skipped without CUDA).

Run on a GPU machine with `pytest -m gpu tests/gpu`. The sync test needs Ray and two GPUs' worth of placement on
one card (fractional GPUs): learner rank 0 and one engine share the device.
"""

import pytest
import torch
from transformers import AutoTokenizer

from shop_r1.config import LearnerConfig, RLConfig

pytestmark = pytest.mark.gpu


def test_nccl_bucketed_broadcast_between_two_actors():
    import socket

    import ray

    from shop_r1.weight_sync.broadcast import SyncGroupSpec, WeightReceiver, WeightSender, make_manifest

    ray.init(num_gpus=1, include_dashboard=False, ignore_reinit_error=True)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        spec = SyncGroupSpec("127.0.0.1", port, 2, backend="nccl")
        tensors = [(f"w{i}", torch.randn(257, 33) * i) for i in range(5)]
        manifest = make_manifest(((n, tuple(t.shape), torch.bfloat16) for n, t in tensors), bucket_bytes=40_000)

        @ray.remote(num_gpus=0.5)
        def send():
            sender = WeightSender(spec, torch.device("cuda"))
            return sender.send(manifest, iter([(n, t.cuda()) for n, t in tensors]))

        @ray.remote(num_gpus=0.5)
        def receive():
            receiver = WeightReceiver(spec, 1, torch.device("cuda"))
            return [(n, t.float().cpu()) for n, t in receiver.receive(manifest)]

        sent, got = ray.get([send.remote(), receive.remote()])
        assert sent == manifest.num_bytes and len(manifest.buckets) > 1
        for (n, t), (m, u) in zip(tensors, got):
            assert n == m
            torch.testing.assert_close(u, t.to(torch.bfloat16).float())
    finally:
        ray.shutdown()


def test_learner_grpo_step_on_cuda_bf16(tiny_model_dir):
    from shop_r1.algo.batch import GRPOBatch
    from shop_r1.learner.deepspeed_learner import DeepSpeedLearner

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "<|im_start|>user\nshoes<|im_end|>\n<|im_start|>assistant\n{\"rationale\""
    ids = torch.tensor([tok(text)["input_ids"]] * 4)
    comp = torch.zeros_like(ids)
    comp[:, -4:] = 1
    batch = GRPOBatch(ids, torch.ones_like(ids), comp, torch.zeros_like(ids), torch.tensor([1.0, -1.0, 0.5, -0.5]),
                      torch.zeros(ids.shape))
    learner = DeepSpeedLearner(str(tiny_model_dir), LearnerConfig(zero_stage=2, dtype="bfloat16"), lr=1e-3,
                               total_steps=2, reference_path=str(tiny_model_dir))
    stats = learner.grpo_step(batch, RLConfig(kl_beta=0.1))
    assert learner.device.type == "cuda" and stats.num_tokens == 16 and stats.grad_norm > 0
    second = learner.grpo_step(batch, RLConfig(kl_beta=0.1))
    assert second.kl > 0  # the policy moved away from the frozen reference
