"""GRPO math with expected values worked out by hand."""

import math

import pytest
import torch

from shop_r1.algo.advantages import group_advantages
from shop_r1.algo.grpo_loss import LossInputs, aggregate, grpo_loss, k3_kl
from shop_r1.config import RLConfig


def _cfg(eps_low=0.2, eps_high=0.2, kl_beta=0.0, loss="dapo"):
    return RLConfig(clip_eps=eps_low, clip_eps_high=eps_high, kl_beta=kl_beta, loss=loss).loss_config(4)


def test_advantages_standardise_within_each_group():
    # group 0: [1, 2, 3] -> mean 2, unbiased std 1 -> (-1, 0, 1)
    # group 1: [0, 0, 1] -> mean 1/3, std sqrt(((1/3)^2*2 + (2/3)^2)/2) = sqrt(1/3) = 0.57735
    #          -> (-1/3, -1/3, 2/3) / 0.57735 = (-0.57735, -0.57735, 1.15470)
    out = group_advantages(torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]]), eps=0.0)
    torch.testing.assert_close(out.advantages, torch.tensor([[-1.0, 0.0, 1.0], [-0.57735, -0.57735, 1.15470]],
                                                           dtype=torch.float64),
                               atol=1e-5, rtol=0)
    assert out.num_zero_signal_groups == 0


def test_constant_group_has_zero_advantage_and_is_flagged():
    out = group_advantages(torch.tensor([[1001.0, 1001.0, 1001.0, 1001.0], [0.8, 0.8, 0.8, 1.8]]))
    assert out.advantages[0].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert out.zero_signal.tolist() == [True, False]
    assert out.num_zero_signal_groups == 1
    # Group 1: mean 1.05, std sqrt((3*0.25^2 + 0.75^2)/3) = sqrt(0.25) = 0.5 -> (-0.5, -0.5, -0.5, 1.5)
    torch.testing.assert_close(out.advantages[1], torch.tensor([-0.5, -0.5, -0.5, 1.5], dtype=torch.float64), atol=1e-5,
                               rtol=0)


def test_single_sample_groups_carry_no_signal():
    out = group_advantages(torch.tensor([[3.0], [7.0]]))
    assert out.advantages.tolist() == [[0.0], [0.0]]
    assert out.num_zero_signal_groups == 2


def test_advantages_reject_a_flat_vector():
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        group_advantages(torch.tensor([1.0, 2.0]))


def _one_token(ratio: float, adv: float, eps_low=0.2, eps_high=0.2):
    old = torch.zeros(1, 1)
    logp = torch.full((1, 1), math.log(ratio), requires_grad=True)
    out = grpo_loss(LossInputs(logp, old, torch.tensor([adv]), torch.ones(1, 1)), _cfg(eps_low, eps_high))
    return out, logp


@pytest.mark.parametrize("ratio, adv, expected_loss, clipped", [
    (1.0, 2.0, -2.0, 0.0),   # inside the trust region: loss = -ratio * A = -2
    (1.5, 1.0, -1.2, 1.0),   # A > 0, ratio above 1 + 0.2: min(1.5, 1.2) = 1.2 -> clipped
    (1.5, -1.0, 1.5, 0.0),   # A < 0, ratio above: min(-1.5, -1.2) = -1.5 -> the unclipped (pessimistic) term
    (0.5, -1.0, 0.8, 1.0),   # A < 0, ratio below 1 - 0.2: min(-0.5, -0.8) = -0.8 -> clipped
    (0.5, 1.0, -0.5, 0.0),   # A > 0, ratio below: min(0.5, 0.8) = 0.5 -> unclipped
])
def test_clipping_on_both_sides(ratio, adv, expected_loss, clipped):
    out, logp = _one_token(ratio, adv)
    assert float(out.loss.detach()) == pytest.approx(expected_loss, abs=1e-6)
    assert out.clip_fraction == clipped
    out.loss.backward()
    # A clipped token has no gradient; an unclipped one has d(-ratio*A)/dlogp = -ratio*A.
    expected_grad = 0.0 if clipped else -ratio * adv
    assert float(logp.grad) == pytest.approx(expected_grad, abs=1e-6)


def test_separate_upper_clip():
    # eps_high 0.28 (clip-higher): ratio 1.25 with A > 0 is no longer clipped.
    out, _ = _one_token(1.25, 1.0, eps_low=0.2, eps_high=0.28)
    assert float(out.loss.detach()) == pytest.approx(-1.25) and out.clip_fraction == 0.0
    out, _ = _one_token(1.4, 1.0, eps_low=0.2, eps_high=0.28)
    assert float(out.loss.detach()) == pytest.approx(-1.28) and out.clip_fraction == 1.0


def test_k3_kl_by_hand():
    # logp = 0 (p = 1), ref_logp = ln 2: exp(ln 2) - ln 2 - 1 = 2 - 0.693147 - 1 = 0.306853
    assert float(k3_kl(torch.tensor(0.0), torch.tensor(math.log(2.0)))) == pytest.approx(0.306853, abs=1e-6)
    # Equal policies: exactly 0.
    assert float(k3_kl(torch.tensor(-1.3), torch.tensor(-1.3))) == 0.0


def test_kl_penalty_enters_the_loss_with_beta():
    logp = torch.zeros(1, 2)
    ref = torch.full((1, 2), math.log(2.0))
    out = grpo_loss(LossInputs(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref_logp=ref), _cfg(kl_beta=0.5))
    # A = 0 -> surrogate 0; loss = 0.5 * 0.306853 = 0.153426
    assert float(out.loss) == pytest.approx(0.153426, abs=1e-6)
    assert out.kl == pytest.approx(0.306853, abs=1e-6)


def test_aggregation_and_masks():
    values = torch.tensor([[1.0, 3.0, 100.0], [5.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(aggregate(values, mask, "dapo")) == pytest.approx(3.0)      # (1 + 3 + 5) / 3
    assert float(aggregate(values, mask, "grpo")) == pytest.approx(3.5)      # (2 + 5) / 2
    assert float(aggregate(values, mask, "dr_grpo", max_new_tokens=4)) == pytest.approx(9 / 8)  # 9 / (2 x 4)


def test_padding_never_reaches_the_loss():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = grpo_loss(LossInputs(logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask), _cfg())
    # token mean over 3 real tokens: (-1 - 1 + 1) / 3 = -1/3
    assert float(out.loss) == pytest.approx(-1 / 3)
    out.loss.backward()
    assert logp.grad[0, 2] == 0 and logp.grad[1, 1] == 0 and logp.grad[1, 2] == 0
    assert float(logp.grad[0, 0]) == pytest.approx(-1 / 3)
