"""The learner's forward math (shop_r1/learner/forward.py), without DeepSpeed: logprobs of given tokens by hand, and
on the tiny model the completion-only LM head and s(r) against the full logits of a plain forward."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from shop_r1.learner.forward import Forward, picked_logprobs, self_certainty_from_logits
from shop_r1.reward.self_certainty import kl_to_uniform_logits
from tests.algo.test_shared_prompt_on_cpu import _grouped_batch


def test_picked_logprobs_by_hand():
    # logits (0, ln 3) -> p = (1/4, 3/4); logits (0, 0) -> (1/2, 1/2)
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    got = picked_logprobs(logits, torch.tensor([1, 0]))
    torch.testing.assert_close(got, torch.tensor([math.log(0.75), math.log(0.5)]))
    # T = 2: logits (0, 2) / 2 = (0, 1) -> p(1) = e / (1 + e)
    hot = picked_logprobs(torch.tensor([[0.0, 2.0]]), torch.tensor([1]), temperature=2.0)
    assert float(hot) == pytest.approx(math.log(math.e / (1 + math.e)), abs=1e-6)


def test_picked_logprobs_are_differentiable_and_match_log_softmax():
    logits = torch.randn(9, 7, requires_grad=True)
    ids = torch.randint(0, 7, (9,))
    got = picked_logprobs(logits, ids, temperature=0.6)
    torch.testing.assert_close(got, torch.log_softmax(logits / 0.6, -1).gather(-1, ids[:, None])[:, 0])
    got.sum().backward()
    assert logits.grad is not None


def test_self_certainty_from_logits_by_hand():
    # Uniform logits are at distance 0 from U; the paper's 1/|V| divides by the logits' width.
    assert self_certainty_from_logits(torch.zeros(3, 5), "p_to_u") == pytest.approx(0.0, abs=1e-7)
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p = (1/4, 3/4): KL(p||U) = sum p ln(2p) = 0.130812
    assert self_certainty_from_logits(logits, "p_to_u") == pytest.approx(0.130812, abs=1e-6)
    assert self_certainty_from_logits(logits, "p_to_u", normalize_by_vocab=True) == pytest.approx(0.130812 / 2,
                                                                                                  abs=1e-6)


@pytest.mark.parametrize("shared_prompt,last_layer", [(False, False), (True, False), (False, True)])
def test_completion_logprobs_and_self_certainty_equal_the_full_forward(tiny_model_dir, shared_prompt, last_layer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    batch = _grouped_batch(0, temperature=0.6)
    forward = Forward(torch.device("cpu"), shared_prompt, last_layer_at_targets=last_layer)
    with torch.no_grad():
        got = forward.completion_logprobs(model, batch)
        certainty = forward.rationale_self_certainty(model, batch, "u_to_p")
        for b in range(batch.num_responses):
            n = int(batch.attention_mask[b].sum())
            logits = model(batch.input_ids[b:b + 1, :n]).logits[0].float()  # [n, V]: position t predicts t + 1
            where = batch.completion_mask[b, 1:n].bool()
            full = torch.log_softmax(logits[:-1] / 0.6, -1).gather(-1, batch.input_ids[b, 1:n, None])[:, 0]
            torch.testing.assert_close(got[b, 1:n][where], full[where], rtol=1e-5, atol=1e-5)
            assert (got[b][~batch.completion_mask[b].bool()] == 0).all()
            rationale = batch.rationale_mask[b, 1:n].bool()
            expected = float(kl_to_uniform_logits(logits[:-1][rationale], "u_to_p").mean()) if rationale.any() else 0.0
            assert certainty[b] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert sum(v != 0 for v in certainty) >= 2


def test_right_padded_by_hand():
    from shop_r1.learner.forward import right_padded

    assert right_padded(torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]]))
    assert right_padded(torch.tensor([[1, 1], [0, 0]]))  # an all-pad row has no real position to change
    assert not right_padded(torch.tensor([[1, 1, 1], [0, 1, 1]]))  # left-padded
    assert not right_padded(torch.tensor([[1, 0, 1]]))  # a hole


def test_right_padded_rows_run_causal_and_left_padded_rows_keep_their_mask(tiny_model_dir):
    """Right-padded rows reach the transformer without the padding mask (its causal mask alone: SDPA's is_causal),
    left-padded ones with it; either way each real position's logprob equals the row run alone."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    seen = []
    model.model.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(kwargs.get("attention_mask")),
                                          with_kwargs=True)
    g = torch.Generator().manual_seed(0)
    lengths = [9, 5, 7]
    rows = [torch.randint(0, model.config.vocab_size, (n,), generator=g) for n in lengths]
    forward = Forward(torch.device("cpu"))
    for left in (False, True):
        ids = torch.zeros(3, 9, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for b, r in enumerate(rows):
            cols = slice(9 - len(r), 9) if left else slice(0, len(r))
            ids[b, cols], attn[b, cols] = r, 1
        target = attn.clone()
        target[:, :1] = 0
        if left:
            target[attn.cumsum(1) == 1] = 0  # each row's first real token is never a target
        seen.clear()
        with torch.no_grad():
            got = forward.target_logprobs(model, ids, attn, target)
        assert (seen[0] is None) == (not left)
        for b, r in enumerate(rows):
            with torch.no_grad():
                alone = torch.log_softmax(model(r[None]).logits[0, :-1].float(), -1).gather(-1, r[1:, None])[:, 0]
            cols = slice(9 - len(r) + 1, 9) if left else slice(1, len(r))
            torch.testing.assert_close(got[b, cols], alone, rtol=1e-5, atol=1e-5)
