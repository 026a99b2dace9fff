"""learner.attention=flex and =split on CUDA: a tiny Qwen2's completion logprobs and the gradient of a weighted logprob
sum through the BlockMask, or through the split SDPA pieces (flash/efficient kernels), equal the dense mask's and the
separate rows' (float32). Run with `pytest -m gpu tests/gpu`;
the CPU half (the mask itself, transformers taking it) is tests/algo/test_flex_shared_prompt_on_cpu.py."""

import pytest
import torch

from shop_r1.learner.forward import Forward
from tests.algo.test_flex_shared_prompt_on_cpu import long_batch, tiny_qwen2
from tests.algo.test_shared_prompt_on_cpu import _grouped_batch

pytestmark = pytest.mark.gpu


def _logprobs_and_grads(forward: Forward, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Completion logprobs [b, T] and the gradient of sum_b adv_b * sum_t logprob[b, t], on a fresh model."""
    model = tiny_qwen2(device="cuda")
    logprobs = forward.completion_logprobs(model, batch)
    (logprobs * batch.advantages.float().to("cuda")[:, None]).sum().backward()
    return logprobs.detach(), {n: p.grad.detach() for n, p in model.named_parameters()}


@pytest.mark.timeout(300)  # transformers compiles flex_attention (forward and backward) on first use
@pytest.mark.parametrize("attention", ["flex", "split"])
@pytest.mark.parametrize("pack", [False, True])
def test_flex_and_split_logprobs_and_gradients_equal_the_dense_mask_and_the_separate_rows(pack, attention):
    dev = torch.device("cuda")
    for batch in (long_batch(0), _grouped_batch(3, temperature=0.7)):
        rows, rows_grad = _logprobs_and_grads(Forward(dev), batch)
        dense, dense_grad = _logprobs_and_grads(Forward(dev, True, pack), batch)
        flex, flex_grad = _logprobs_and_grads(Forward(dev, True, pack, attention), batch)
        where = batch.completion_mask.bool().to(dev)
        worst = max(float(((flex_grad[n] - g[n]).abs() / g[n].abs().max()).max()) for g in (dense_grad, rows_grad)
                    for n in flex_grad)
        off = {name: float((flex - want)[where].abs().max()) for name, want in (("dense", dense), ("rows", rows))}
        print(f"{attention} pack={pack} T={batch.input_ids.shape[1]}: |{attention} - dense| logprob "
              f"{off['dense']:.2e}, |{attention} - rows| {off['rows']:.2e}, largest gradient difference / the "
              f"tensor's largest entry {worst:.2e}")
        for want in (dense, rows):
            torch.testing.assert_close(flex[where], want[where], rtol=1e-5, atol=1e-5)
        for name, got in flex_grad.items():
            for want in (dense_grad[name], rows_grad[name]):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
