import math

import torch

from shop_r1.algo.logprobs import token_logprobs_from_logits


def test_by_hand_and_chunking():
    # logits (0, ln 3) -> p = (1/4, 3/4)
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    lp = token_logprobs_from_logits(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.75), math.log(0.5)]]))
    big = torch.randn(9, 5, 7, requires_grad=True)
    ids = torch.randint(0, 7, (9, 5))
    ref = torch.log_softmax(big, -1).gather(-1, ids[..., None])[..., 0]
    got = token_logprobs_from_logits(big, ids, chunk_rows=2)
    torch.testing.assert_close(got, ref)
    got.sum().backward()  # differentiable
    assert big.grad is not None


def test_temperature():
    logits = torch.tensor([[[0.0, 2.0]]])
    # T = 2 -> logits (0, 1): p(1) = e / (1 + e)
    lp = token_logprobs_from_logits(logits, torch.tensor([[1]]), temperature=2.0)
    assert abs(float(lp) - math.log(math.e / (1 + math.e))) < 1e-6
