"""The GRPO step against the backend protocol, on a plain-torch backend (one rank, no DeepSpeed): for every rl.loss
variant a batch split into micro-batches gives the loss and the gradient of the whole batch as one, and the
backend sees the protocol's calls (a micro-batch boundary before each backward, one optimizer step)."""

from collections.abc import Iterator, Sequence

import pytest
import torch
from transformers import AutoModelForCausalLM

from shop_r1.algo.grpo_loss import LossInputs, grpo_loss
from shop_r1.config import LearnerConfig, RLConfig
from shop_r1.learner.backend import OptimizerStep, lr_scheduler
from shop_r1.learner.forward import Forward
from shop_r1.learner.grpo_step import (
    grpo_update,
    micro_batches,
    minibatch_rows,
    probe_logprobs,
    rationale_self_certainty,
)
from shop_r1.learner.protocol import TrainingRank
from tests.algo.test_shared_prompt_on_cpu import _grouped_batch


class TorchBackend:
    """TrainingRank (what the steps use of a learner rank) in plain torch on one rank. Its optimizer step takes no
    step: it keeps the gradient."""

    def __init__(self, model: torch.nn.Module, cfg: LearnerConfig, reference: torch.nn.Module | None = None):
        self._model, self.cfg, self.reference, self.rank, self.world_size = model, cfg, reference, 0, 1
        self.scheduler = lr_scheduler(torch.optim.SGD(model.parameters(), lr=0.5), 10, 0, "constant")
        self.calls: list[str] = []
        self.grads: list[dict[str, torch.Tensor]] = []

    @property
    def policy(self) -> torch.nn.Module:
        return self._model

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def begin_micro_batch(self) -> None:
        self.calls.append("begin")

    def backward(self, loss: torch.Tensor) -> None:
        self.calls.append("backward")
        loss.backward()

    def optimizer_step(self, losses: Sequence[float]) -> OptimizerStep:
        self.calls.append("step")
        self.grads.append({n: p.grad.clone() for n, p in self._model.named_parameters() if p.grad is not None})
        norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in self.grads[-1].values()])))
        self._model.zero_grad(set_to_none=True)
        return OptimizerStep(norm)

    def all_reduce(self, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return values

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from ((n, p.detach()) for n, p in self._model.named_parameters())

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> None:
        raise NotImplementedError

    def load_checkpoint(self, ckpt_dir: str) -> dict:
        raise NotImplementedError


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # a reference that differs from the policy, so the KL term has a gradient
        for p in reference.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return policy, reference.requires_grad_(False)


@pytest.mark.parametrize("loss", ["dapo", "grpo", "dr_grpo", "gspo"])
def test_a_split_batch_gives_the_whole_batchs_loss_and_gradient(models, loss):
    policy, reference = models
    batch = _grouped_batch(1)
    cfg = RLConfig(loss=loss, kl_beta=0.1).loss_config(max_new_tokens=8)
    backend = TorchBackend(policy, LearnerConfig(max_tokens_per_micro_batch=24), reference)
    assert isinstance(backend, TrainingRank)
    assert len(micro_batches(backend, batch)) == 3
    stats = grpo_update(backend, batch, cfg, step=7)
    assert backend.calls == ["begin", "backward"] * 3 + ["step"] and stats.step == 7 and stats.num_tokens == 22

    # The whole batch as one, by hand: the loss of grpo_loss over every row (its formula: test_loss_variants).
    forward = Forward(torch.device("cpu"))
    logp = forward.completion_logprobs(policy, batch)
    with torch.no_grad():
        ref = forward.completion_logprobs(reference, batch)
    whole = grpo_loss(LossInputs(logp, logp.detach(), batch.advantages, batch.completion_mask, ref_logp=ref), cfg)
    whole.loss.backward()
    expected = {n: p.grad.clone() for n, p in policy.named_parameters()}
    policy.zero_grad(set_to_none=True)
    assert stats.loss == pytest.approx(float(whole.loss.detach()), rel=1e-5)
    assert stats.kl == pytest.approx(whole.kl, rel=1e-4)
    (got,) = backend.grads
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert max(float(g.abs().max()) for g in expected.values()) > 1e-4


def test_minibatch_rows_split_a_ranks_rows_into_even_consecutive_blocks():
    assert minibatch_rows(6, 1) == [[0, 1, 2, 3, 4, 5]]
    assert minibatch_rows(7, 3) == [[0, 1], [2, 3], [4, 5, 6]]
    assert minibatch_rows(2, 4) == [[], [0], [], [1]]  # fewer rows than mini-batches: some blocks are empty
    assert minibatch_rows(0, 2) == [[], []]


@pytest.mark.parametrize("max_tokens", [24, 4096])
def test_num_minibatches_takes_one_optimizer_step_per_block_of_rows(models, max_tokens):
    """rl.num_minibatches=2: two optimizer steps, each with the gradient of its half of the rows as a batch of its
    own, whether the rows fill one micro-batch (max_tokens 4096: the split used to be over micro-batches, so one
    micro-batch meant one step and the setting did nothing) or several."""
    policy, reference = models
    batch = _grouped_batch(1)
    cfg = RLConfig(loss="dapo", kl_beta=0.1, num_minibatches=2).loss_config(max_new_tokens=8)
    backend = TorchBackend(policy, LearnerConfig(max_tokens_per_micro_batch=max_tokens), reference)
    stats = grpo_update(backend, batch, cfg, step=3)
    assert backend.calls.count("step") == 2 and len(backend.grads) == 2
    assert stats.num_tokens == 22
    forward = Forward(torch.device("cpu"))
    half_losses = []
    for rows, got in zip(minibatch_rows(batch.num_responses, 2), backend.grads):
        half = batch.select(rows)
        logp = forward.completion_logprobs(policy, half)
        with torch.no_grad():
            ref = forward.completion_logprobs(reference, half)
        loss = grpo_loss(LossInputs(logp, logp.detach(), half.advantages, half.completion_mask, ref_logp=ref), cfg)
        loss.loss.backward()
        half_losses.append(float(loss.loss.detach()))
        for name, p in policy.named_parameters():
            torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
        policy.zero_grad(set_to_none=True)
    # The step's loss: the mean of the two mini-batches' losses.
    assert stats.loss == pytest.approx(sum(half_losses) / 2, rel=1e-5)
    assert any(not torch.allclose(backend.grads[0][n], backend.grads[1][n]) for n in backend.grads[0])


def test_the_variants_train_differently(models):
    """The switch reaches the update: dapo and grpo weigh the responses (of 1 to 7 tokens) differently."""
    policy, _ = models
    grads = []
    for loss in ("dapo", "grpo"):
        backend = TorchBackend(policy, LearnerConfig())
        grpo_update(backend, _grouped_batch(1), RLConfig(loss=loss, kl_beta=0.0).loss_config(8), step=1)
        grads.append(backend.grads[0])
    assert any(not torch.allclose(grads[0][n], grads[1][n], rtol=1e-3) for n in grads[0])


def test_no_grad_forwards_drop_the_padding_rows(models):
    policy, _ = models
    batch = _grouped_batch(2)
    backend = TorchBackend(policy, LearnerConfig(max_tokens_per_micro_batch=24))
    assert [len(x) for x in probe_logprobs(backend, batch)] == [4, 7, 1, 5, 3, 2]
    certainty = rationale_self_certainty(backend, batch, "p_to_u")
    assert len(certainty) == batch.num_responses and certainty == pytest.approx(
        Forward(torch.device("cpu")).rationale_self_certainty(policy, batch, "p_to_u"), rel=1e-4, abs=1e-6)
    assert rationale_self_certainty(backend, batch.select([]), "p_to_u") == []
