"""The SFT step against the backend protocol (shop_r1/learner/sft_step.py), on the plain-torch backend of
test_grpo_step_on_cpu.py: the loss is the global batch's token mean, by its definition, whatever the micro-batch
split; an idle rank joins with an empty micro-batch that adds nothing; a skipped step reports nothing non-finite."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from shop_r1.config import LearnerConfig
from shop_r1.learner.backend import OptimizerStep
from shop_r1.learner.sft_data import MicroBatch
from shop_r1.learner.sft_step import eval_loss, sft_update
from tests.learner.test_grpo_step_on_cpu import TorchBackend


def _micro_batch(rows: list[int]) -> MicroBatch:
    """Rows of 6 tokens, row r right-padded after 6 - r tokens; the last 2 real tokens of each row are targets."""
    ids = torch.randint(3, 100, (3, 6), generator=torch.Generator().manual_seed(0))[rows]
    attention = torch.tensor([[1] * (6 - r) + [0] * r for r in rows])
    loss = torch.tensor([[0] * (4 - r) + [1, 1] + [0] * r for r in rows])
    return MicroBatch(ids, attention, loss, int(loss.sum()))


def _token_mean_loss(policy: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """The definition: -mean over target tokens t of log softmax(logits at t - 1)[token t], from the full forward."""
    logits = policy(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, mb.input_ids[:, 1:, None])[..., 0]
    return -(picked * mb.loss_mask[:, 1:]).sum() / mb.loss_mask[:, 1:].sum()


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def test_a_split_batch_gives_the_token_mean_loss_and_gradient_of_the_whole(policy):
    whole = _micro_batch([0, 1, 2])
    assert whole.num_loss_tokens == 6
    expected = _token_mean_loss(policy, whole)
    backends = []
    for split in ([[0, 1, 2]], [[0], [1, 2]]):
        backend = TorchBackend(policy, LearnerConfig())
        stats = sft_update(backend, [_micro_batch(rows) for rows in split], num_loss_tokens_global=6, step=7)
        assert stats.loss == pytest.approx(float(expected), rel=1e-5)
        assert (stats.num_tokens, stats.lr, stats.step, stats.nonfinite) == (6, 0.5, 7, "")
        assert backend.calls == ["begin", "backward"] * len(split) + ["step"]
        backends.append(backend)
    one, two = (b.grads[0] for b in backends)
    assert one.keys() == two.keys() and all(torch.allclose(one[n], two[n], atol=1e-6) for n in one)
    assert eval_loss(backends[0], [_micro_batch([0]), _micro_batch([1, 2])]) == pytest.approx(float(expected),
                                                                                             rel=1e-5)


def test_an_idle_rank_joins_with_an_empty_micro_batch_that_adds_nothing(policy):
    backend = TorchBackend(policy, LearnerConfig())
    stats = sft_update(backend, [], num_loss_tokens_global=6, step=1)
    assert backend.calls == ["begin", "backward", "step"]
    assert backend.grads[0] and all(not g.any() for g in backend.grads[0].values())
    assert (stats.loss, stats.num_tokens, stats.grad_norm) == (0.0, 0, 0.0)
    with pytest.raises(ValueError, match="no assistant tokens"):
        sft_update(backend, [], num_loss_tokens_global=0, step=2)


def test_a_skipped_step_reports_its_cause_and_no_figure(policy):
    backend = TorchBackend(policy, LearnerConfig())
    backend.optimizer_step = lambda losses: OptimizerStep(float("inf"), "grad_norm")
    stats = sft_update(backend, [_micro_batch([0])], num_loss_tokens_global=2, step=3)
    assert (stats.loss, stats.grad_norm, stats.num_tokens, stats.nonfinite) == (0.0, 0.0, 2, "grad_norm")
    policy.zero_grad(set_to_none=True)
