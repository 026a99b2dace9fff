"""GRPO pieces on CUDA: the weight-sync group (gloo and NCCL) and a learner GRPO step in bf16 (skipped without CUDA).

Run on a GPU machine with `pytest -m gpu tests/gpu`. The sync test runs the two ranks in threads (no Ray): gloo with
both on one card, NCCL with two cards (NCCL refuses two ranks on one card).
"""

import pytest
import torch
from transformers import AutoTokenizer

from shop_r1.config import LearnerConfig, RLConfig

pytestmark = pytest.mark.gpu


def _broadcast_in_threads(backend: str, sender_device: str, receiver_device: str):
    """Sender (rank 0) and receiver (rank 1) of one sync group, each in its own thread, as in the learner's and an
    engine's actors; returns (bytes sent, the manifest, the tensors sent, the tensors received)."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from shop_r1.weight_sync.broadcast import SyncGroupSpec, WeightReceiver, WeightSender, make_manifest

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = SyncGroupSpec("127.0.0.1", port, 2, backend=backend, timeout_s=120)
    g = torch.Generator().manual_seed(0)
    tensors = [(f"w{i}", torch.randn(257, 33, generator=g) * i) for i in range(5)]
    manifest = make_manifest(((n, tuple(t.shape), torch.bfloat16) for n, t in tensors), bucket_bytes=40_000)

    def send():
        torch.cuda.set_device(torch.device(sender_device))
        sender = WeightSender(spec, torch.device(sender_device))
        return sender.send(manifest, iter([(n, t.to(sender_device)) for n, t in tensors]))

    def receive():
        torch.cuda.set_device(torch.device(receiver_device))
        receiver = WeightReceiver(spec, 1, torch.device(receiver_device))
        return [(n, t.float().cpu()) for n, t in receiver.receive(manifest)]

    with ThreadPoolExecutor(2) as pool:
        sent, got = pool.submit(send), pool.submit(receive)
        return sent.result(timeout=180), manifest, tensors, got.result(timeout=180)


@pytest.mark.timeout(300)  # a party that fails leaves the other waiting in a collective: fail, do not hang
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_bucketed_broadcast_of_cuda_tensors(backend):
    """gloo: sender and receiver on one card (fractional placement, `sync_backend`'s fallback: NCCL refuses two
    ranks on one card). nccl: two cards, as with whole GPUs per actor (skipped on a one-GPU machine)."""
    if backend == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs the two ranks on two different GPUs")
    receiver_device = "cuda:1" if backend == "nccl" else "cuda:0"
    sent, manifest, tensors, got = _broadcast_in_threads(backend, "cuda:0", receiver_device)
    assert sent == manifest.num_bytes and len(manifest.buckets) > 1
    for (n, t), (m, u) in zip(tensors, got):
        assert n == m
        torch.testing.assert_close(u, t.to(torch.bfloat16).float())


def _learner_cls(backend: str) -> type:
    """The learner rank, skipped where the backend's framework is missing: a GPU machine without DeepSpeed still
    checks FSDP2 (the rank imports a backend only when it builds it)."""
    if backend == "deepspeed":
        pytest.importorskip("deepspeed")
    from shop_r1.learner.rank import LearnerRank

    return LearnerRank


@pytest.mark.parametrize("backend", ["deepspeed", "fsdp2"])
def test_learner_grpo_step_on_cuda_bf16(tiny_model_dir, backend):
    from shop_r1.algo.batch import GRPOBatch

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "<|im_start|>user\nshoes<|im_end|>\n<|im_start|>assistant\n{\"rationale\""
    ids = torch.tensor([tok(text)["input_ids"]] * 4)
    comp = torch.zeros_like(ids)
    comp[:, -4:] = 1
    batch = GRPOBatch(ids, torch.ones_like(ids), comp, torch.zeros_like(ids), torch.tensor([1.0, -1.0, 0.5, -0.5]),
                      torch.zeros(ids.shape))
    learner_cls = _learner_cls(backend)
    learner = learner_cls(str(tiny_model_dir), LearnerConfig(backend=backend, zero_stage=2, dtype="bfloat16"), lr=1e-3,
                          total_steps=2, reference_path=str(tiny_model_dir))
    stats = learner.grpo_step(batch, RLConfig(kl_beta=0.1).loss_config(max_new_tokens=16))
    assert learner.device.type == "cuda" and stats.num_tokens == 16 and stats.grad_norm > 0
    second = learner.grpo_step(batch, RLConfig(kl_beta=0.1).loss_config(max_new_tokens=16))
    assert second.kl > 0  # the policy moved away from the frozen reference


@pytest.mark.parametrize("backend", ["deepspeed", "fsdp2"])
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 5e-3)])
def test_learner_logprobs_at_sampling_temperature_on_cuda(tiny_model_dir, dtype, tol, backend):
    """The learner scores log softmax(logits / T) on CUDA as on CPU: against a float32 transformers forward at
    T = 0.6 (measured on an H100: 5e-7 in float32, 9e-4 in bf16)."""
    from transformers import AutoModelForCausalLM

    from shop_r1.algo.batch import GRPOBatch

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "<|im_start|>user\nfind running shoes<|im_end|>\n<|im_start|>assistant\n{\"r"
    ids = torch.tensor([tok(text)["input_ids"]])
    comp = torch.zeros_like(ids)
    comp[:, -5:] = 1
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda()
    with torch.no_grad():
        logits = model(ids.cuda()).logits[0, :-1].double() / 0.6
    want = torch.log_softmax(logits, -1).gather(1, ids[0, 1:].cuda()[:, None])[:, 0][comp[0, 1:].bool().cuda()]
    learner_cls = _learner_cls(backend)
    learner = learner_cls(str(tiny_model_dir), LearnerConfig(backend=backend, zero_stage=2, dtype=dtype), lr=1e-3,
                          total_steps=1)
    batch = GRPOBatch(ids, torch.ones_like(ids), comp, torch.zeros_like(ids), torch.zeros(1, dtype=torch.float64),
                      torch.zeros(ids.shape), temperature=0.6)
    got = torch.tensor(learner.probe_logprobs(batch)[0], dtype=torch.float64)
    torch.testing.assert_close(got, want.cpu(), atol=tol, rtol=0)
