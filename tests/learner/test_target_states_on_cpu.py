"""The last layer run only at the targets (shop_r1/learner/target_states.py, learner.last_layer_at_targets): the
same logprobs and gradients as the full forward, on Qwen2 and Llama layouts built in code (grouped-query heads),
right- and left-padded rows, SDPA and eager attention; layouts it cannot run take the full forward."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from shop_r1.learner import target_states
from shop_r1.learner.forward import Forward


def _model(kind: str, attn: str = "sdpa", **extra):
    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32, max_position_embeddings=64, attn_implementation=attn, **extra)
    model = (Qwen2ForCausalLM(Qwen2Config(**common)) if kind == "qwen2"
             else LlamaForCausalLM(LlamaConfig(attention_bias=True, **common)))
    return model.float()


def _rows(left: bool = False):
    """Three rows of lengths 20, 13, 7 padded to 20 (right, or left), and a target mask on each row's tail (the
    last row has none: a row with no target)."""
    g = torch.Generator().manual_seed(1)
    lengths, width = (20, 13, 7), 20
    ids = torch.randint(1, 97, (3, width), generator=g)
    attention = torch.zeros(3, width, dtype=torch.long)
    targets = torch.zeros(3, width, dtype=torch.long)
    for r, (n, tail) in enumerate(zip(lengths, (6, 4, 0))):
        span = slice(width - n, width) if left else slice(0, n)
        attention[r, span] = 1
        start = (width if left else n) - tail
        targets[r, start:start + tail] = 1
    targets[1, (width - 13 if left else 0) + 3] = 1  # a lone target early in a row
    return ids * attention, attention, targets


def _logprobs_and_grads(model, on: bool, rows):
    model.zero_grad()
    ids, attention, targets = rows
    got = Forward(torch.device("cpu"), last_layer_at_targets=on).target_logprobs(model, ids, attention, targets, 0.7)
    (got * torch.linspace(0.5, 1.5, got.numel()).view_as(got)).sum().backward()
    return got.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind,attn,left", [("qwen2", "sdpa", False), ("qwen2", "sdpa", True),
                                            ("qwen2", "eager", False), ("llama", "sdpa", False),
                                            ("llama", "eager", True)])
def test_logprobs_and_gradients_equal_the_full_forward(kind, attn, left):
    model = _model(kind, attn).train()
    assert target_states.supports(model)
    rows = _rows(left)
    full, full_grads = _logprobs_and_grads(model, False, rows)
    fast, fast_grads = _logprobs_and_grads(model, True, rows)
    assert (full != 0).sum() == rows[2][:, 1:].sum() == (fast != 0).sum() == 11
    torch.testing.assert_close(fast, full, rtol=1e-5, atol=1e-5)
    assert set(fast_grads) == set(full_grads)
    for name, grad in full_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_states_are_the_full_forwards_rows_in_row_major_order():
    model = _model("qwen2").eval()
    ids, attention, targets = _rows()
    where = targets[:, 1:].bool()
    with torch.no_grad():
        full = model.model(input_ids=ids).last_hidden_state[:, :-1][where]
        got = target_states.final_states_at(model, ids, None, where)
    assert got.shape == (11, 64)
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)


def test_layouts_it_cannot_run_take_the_full_forward():
    sliding = _model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert not target_states.supports(sliding)
    rows = _rows()
    full, _ = _logprobs_and_grads(sliding, False, rows)
    fast, _ = _logprobs_and_grads(sliding, True, rows)
    torch.testing.assert_close(fast, full, rtol=0, atol=0)  # the very same path
    dropout = _model("llama", attention_dropout=0.1).train()
    assert not target_states.supports(dropout) and target_states.supports(dropout.eval())
    tp = _model("llama", pretraining_tp=2)
    assert not target_states.supports(tp)
    assert not target_states.supports(torch.nn.Linear(2, 2))


def test_the_key_is_on_by_default_and_harmless_on_resume():
    from shop_r1.config import LearnerConfig
    from shop_r1.run_config import HARMLESS

    assert LearnerConfig().last_layer_at_targets is True
    assert "learner.last_layer_at_targets" in HARMLESS


def test_sequence_packing_takes_the_same_path_on_every_rank(monkeypatch):
    """With learner.pack_sequences the path must not depend on a rank's rows (whether packing saves lines does):
    under ZeRO-3 every rank calls the modules in the same order, so packed and unpacked rows both run the last
    layer at the targets (the same modules, in the same order), and both give the full forward's logprobs."""
    model = _model("qwen2").eval()
    ids, attention, targets = _rows()
    real = target_states.final_states_at
    calls = []
    monkeypatch.setattr(target_states, "final_states_at", lambda *a, **k: calls.append(a[1].shape) or real(*a, **k))
    with torch.no_grad():
        for rows in (slice(0, 3), slice(0, 1)):  # three uneven rows pack into fewer lines; one row does not
            fast = Forward(torch.device("cpu"), pack=True, last_layer_at_targets=True).target_logprobs(
                model, ids[rows], attention[rows], targets[rows])
            full = Forward(torch.device("cpu"), pack=True, last_layer_at_targets=False).target_logprobs(
                model, ids[rows], attention[rows], targets[rows])
            torch.testing.assert_close(fast, full, rtol=1e-5, atol=1e-5)
    assert calls == [(2, 20), (1, 20)]  # two packed lines of 20; the lone row as it is


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("attention", ["dense", "split"])
@pytest.mark.parametrize("pack", [False, True])
def test_shared_prompt_lines_run_the_last_layer_at_their_targets_with_equal_logprobs_and_gradients(
        monkeypatch, kind, attention, pack):
    """GRPO rows packed per prompt (learner.shared_prompt), several packs a line with `pack`, through the dense mask or
    the split pieces: the last layer run at the completion tokens and each prompt's last token gives the full
    forward's completion logprobs at T = 0.7 and gradients (float32), and it really ran that way (once per forward,
    on the packed lines, at fewer positions than the lines hold)."""
    from tests.algo.test_flex_shared_prompt_on_cpu import long_batch, tiny_qwen2
    from tests.algo.test_split_attention_on_cpu import tiny_llama

    batch = long_batch(2)
    weights = torch.linspace(-1.0, 1.0, batch.input_ids.numel()).view(batch.input_ids.shape)
    real = target_states.final_states_at
    calls = []
    monkeypatch.setattr(target_states, "final_states_at",
                        lambda *a, **k: calls.append((a[1].shape, int(a[3].sum()))) or real(*a, **k))
    out = []
    for on in (False, True):
        model = (tiny_qwen2 if kind == "qwen2" else tiny_llama)().train()
        fwd = Forward(torch.device("cpu"), True, pack, attention, last_layer_at_targets=on)
        logp = fwd.completion_logprobs(model, batch)
        (logp * weights).sum().backward()
        out.append((logp.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (full, full_grads), (fast, fast_grads) = out
    torch.testing.assert_close(fast, full, rtol=1e-5, atol=1e-5)
    assert fast_grads.keys() == full_grads.keys()
    for name, grad in full_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # long_batch: a 300-token prompt with completions of 170, 40, 129 and 1 tokens, a 20-token one with 9 and 5. A
    # completion token is predicted by the state before it: the prompt's last token for its first, its own
    # tokens but the last for the rest: 169 + 39 + 128 + 0 + 8 + 4 = 348 positions, plus the two prompts' last.
    (shape, positions), = calls
    assert positions == 350 and positions < shape[0] * shape[1]
