"""Self-certainty: hand values, the top-k estimate against the exact value from full logits, token masks."""

import math

import pytest
import torch

from shop_r1.config import RewardConfig, SelfCertaintyConfig
from shop_r1.reward.self_certainty import (
    check_reward_config,
    kl_to_uniform_logits,
    kl_to_uniform_topk,
    rationale_token_mask,
    self_certainty,
)
from shop_r1.types import TokenLogprobs


def test_topk_by_hand():
    # V = 4, known p = (0.5, 0.25), unseen 0.25 over 2 tokens -> 0.125 each
    # sum p log p = 0.5 ln .5 + .25 ln .25 + .25 ln .125 = -0.34657 - 0.34657 - 0.51986 = -1.21301
    # + ln 4 = 1.38629 -> 0.17329
    (kl,) = kl_to_uniform_topk([[math.log(0.5), math.log(0.25)]], vocab_size=4)
    assert kl == pytest.approx(0.1732868, abs=1e-6)
    # A uniform distribution is as uncertain as it gets: KL = 0.
    assert kl_to_uniform_topk([[math.log(0.25)] * 4], 4)[0] == pytest.approx(0.0, abs=1e-12)
    # A point mass: KL = log V.
    assert kl_to_uniform_topk([[0.0]], 1000)[0] == pytest.approx(math.log(1000))


def test_exact_by_hand_both_directions():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]], dtype=torch.float64))
    assert float(kl_to_uniform_logits(logits, "p_to_u")[0]) == pytest.approx(0.1732868, abs=1e-6)
    # p = (.7, .1, .1, .1):
    # KL(p||U) = .7 ln .7 + .3 ln .1 + ln 4 = -0.249672 - 0.690776 + 1.386294 = 0.445846
    # KL(U||p) = -ln 4 - (ln .7 + 3 ln .1) / 4 = -1.386294 + (0.356675 + 6.907755) / 4 = 0.429814
    logits = torch.log(torch.tensor([[0.7, 0.1, 0.1, 0.1]], dtype=torch.float64))
    assert float(kl_to_uniform_logits(logits, "p_to_u")[0]) == pytest.approx(0.445846, abs=1e-6)
    assert float(kl_to_uniform_logits(logits, "u_to_p")[0]) == pytest.approx(0.429814, abs=1e-6)


def test_topk_estimate_is_a_lower_bound_of_exact_and_equal_at_full_k():
    torch.manual_seed(0)
    vocab = 50
    logits = torch.randn(12, vocab, dtype=torch.float64) * 3
    exact = kl_to_uniform_logits(logits, "p_to_u")
    logp = torch.log_softmax(logits, dim=-1)
    for k in (1, 5, 20):
        top = logp.topk(k, dim=-1).values.tolist()
        est = torch.tensor(kl_to_uniform_topk(top, vocab), dtype=torch.float64)
        assert bool((est <= exact + 1e-9).all()), k
    full = torch.tensor(kl_to_uniform_topk(logp.tolist(), vocab), dtype=torch.float64)
    torch.testing.assert_close(full, exact, atol=1e-9, rtol=0)
    # With 20 of 50 tokens known the estimate is close: the unseen tail carries little mass.
    top20 = torch.tensor(kl_to_uniform_topk(logp.topk(20, dim=-1).values.tolist(), vocab), dtype=torch.float64)
    assert float((exact - top20).max()) < 0.05


def test_rationale_token_mask_from_offsets():
    text = '{"rationale": "I like it", "action": {"type": "terminate"}}'
    span = (15, 24)  # "I like it"
    assert text[span[0]:span[1]] == "I like it"
    offsets = [0, 2, 13, 15, 17, 22, 24, 26]  # tokens: '{"', 'rationale":', ' "', 'I ', 'like ', 'it', '",', ...
    assert rationale_token_mask(offsets, len(text), span) == [False, False, False, True, True, True, False, False]
    # A token straddling the opening quote and the first letter belongs to the rationale.
    assert rationale_token_mask([0, 14, 16], len(text), span) == [False, True, True]
    # An empty rationale has no tokens.
    assert rationale_token_mask([0, 5, 10], 20, (8, 8)) == [False, False, False]


def test_self_certainty_mean_over_rationale_tokens_and_normalisation():
    lp = TokenLogprobs(token_offsets=(0, 3, 6), topk_logprobs=((0.0,), (math.log(0.5), math.log(0.5)), (0.0,)),
                       vocab_size=4)
    # Rationale covers token 1 only: p = (.5, .5, 0, 0) -> KL = ln .5 + ln 4 = ln 2
    s = self_certainty(lp, (3, 6), 9, SelfCertaintyConfig())
    assert s == pytest.approx(math.log(2))
    assert self_certainty(lp, (3, 6), 9, SelfCertaintyConfig(normalize_by_vocab=True)) == pytest.approx(math.log(2) / 4)
    # Tokens 0..2: (ln 4 + ln 2 + ln 4) / 3
    expected = (3 * math.log(2) + 2 * math.log(2)) / 3
    assert self_certainty(lp, (0, 9), 9, SelfCertaintyConfig()) == pytest.approx(expected)


def test_direction_u_to_p_needs_the_exact_source():
    with pytest.raises(ValueError, match="learner_logits"):
        check_reward_config(RewardConfig(self_certainty=SelfCertaintyConfig(direction="u_to_p",
                                                                           source="topk_logprobs")))
    check_reward_config(RewardConfig(self_certainty=SelfCertaintyConfig(direction="u_to_p", source="learner_logits")))
