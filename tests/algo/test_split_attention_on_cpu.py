"""learner.attention=split (shop_r1/learner/split_attention.py): each shared-prompt pack attended as two SDPA pieces.
The layout read back by hand; the pieces cover exactly the dense mask's allowed pairs on random batches; Qwen2 and
Llama built in code give the dense mask's hidden states, logprobs and gradients with and without sequence packing
(the layout reaching every attention call); a forward without a layout after the switch is SDPA's, bit for bit;
refusals name the key, and a sliding-window model falls back to the dense mask."""

import dataclasses

import pytest
import torch

from shop_r1.algo.shared_prompt import pack_rows, pack_shared_prompts, prefix_lengths
from shop_r1.learner import split_attention
from shop_r1.learner.forward import Forward
from shop_r1.learner.split_attention import SplitLayout
from tests.algo.test_flex_shared_prompt_on_cpu import long_batch, tiny_qwen2
from tests.algo.test_shared_prompt_on_cpu import _grouped_batch, _rows, random_groups


def tiny_llama(seed: int = 0):
    """A random 2-layer Llama (head_dim 32, 4 query heads on 2 KV heads), float32, built in code."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).float()


def test_layout_reads_packs_prompts_and_padding_by_hand():
    """Prompt A (3 tokens) with completions of 2 and 1; prompt B (2 tokens) with one of 2; a row C sharing nothing
    (4 tokens, no completion). Packs 6, 4 and 4 tokens wide; first-fit decreasing into 6-wide lines puts each on a
    line of its own (4 + 4 > 6)."""
    ids, attn, comp = _rows([([1, 2, 3], [4, 5]), ([1, 2, 3], [6]), ([7, 8], [9, 10]), ([11, 12, 13, 14], [])])
    packed = pack_shared_prompts(ids, attn, prefix_lengths(comp, attn), pack=True)
    layout = SplitLayout.of(packed, "cpu")
    assert layout.width == 6
    assert [[(p.start, p.prompt, p.end) for p in line] for line in layout.lines] == [[(0, 3, 6)], [(0, 2, 4)],
                                                                                     [(0, 4, 4)]]
    # A's completions: token 3 (completion 1) sees the prompt and itself, token 4 also token 3, token 5 (completion
    # 2) the prompt and itself only.
    assert layout.lines[0][0].completion_mask[0, 0].int().tolist() == [[1, 1, 1, 1, 0, 0],
                                                                       [1, 1, 1, 1, 1, 0],
                                                                       [1, 1, 1, 0, 0, 1]]
    assert layout.lines[2][0].completion_mask is None
    # Two short rows packed into one line without sharing: two packs, then padding.
    ids, attn, _ = _rows([([1, 2], [3]), ([4, 5, 6, 7, 8, 9], []), ([10], [11, 12])])
    layout = SplitLayout.of(pack_rows(ids, attn), "cpu")
    assert [[(p.start, p.prompt, p.end) for p in line] for line in layout.lines] == [[(0, 6, 6)],
                                                                                     [(0, 3, 3), (3, 3, 6)]]


def _covered(layout: SplitLayout) -> torch.Tensor:
    """[n, 1, W, W] bool: the pairs the split pieces compute (prompt causal, completions through their mask)."""
    out = torch.zeros(len(layout.lines), 1, layout.width, layout.width, dtype=torch.bool)
    for i, packs in enumerate(layout.lines):
        for p in packs:
            mid = p.start + p.prompt
            out[i, 0, p.start:mid, p.start:mid] = torch.ones(p.prompt, p.prompt, dtype=torch.bool).tril()
            if p.completion_mask is not None:
                out[i, 0, mid:p.end, p.start:p.end] = p.completion_mask[0, 0]
    return out


@pytest.mark.parametrize("pack", [False, True])
def test_pieces_compute_exactly_the_dense_masks_pairs_on_random_batches(pack):
    """Random groups, prompts and completions (empty ones too), with and without sequence packing: at every real
    query the pairs the pieces compute are the dense mask's allowed pairs, no more, no fewer."""
    for _, ids, attn, comp in random_groups(7, 60, prompt_tokens=(1, 7), completion_tokens=(0, 6), pad=(1, 3)):
        packed = pack_shared_prompts(ids, attn, prefix_lengths(comp, attn), pack)
        real = (packed.segments >= 0).view(packed.segments.shape[0], 1, -1, 1)
        covered = _covered(SplitLayout.of(packed, "cpu"))
        assert torch.equal(covered & real, packed.allowed & real)
        assert not (covered & ~real).any()  # padding queries compute nothing


def _hidden(model, packed, split: bool) -> torch.Tensor:
    inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids}
    if split:
        split_attention.ready(model)
        return model.model(**inputs, attention_mask=packed.allowed,
                           shop_r1_split=SplitLayout.of(packed, "cpu")).last_hidden_state
    return model.model(**inputs, attention_mask=packed.additive_mask(torch.float32)).last_hidden_state


@pytest.mark.parametrize("build", [tiny_qwen2, tiny_llama])
@pytest.mark.parametrize("pack", [False, True])
def test_split_gives_the_dense_masks_hidden_states(build, pack):
    """Every real position's final hidden state through the split pieces equals the dense mask's (float32, 1e-5):
    long prompts and completions over several lines, and short groups packed several to a line."""
    for batch in (long_batch(0), _grouped_batch(3)):
        packed = pack_shared_prompts(batch.input_ids, batch.attention_mask,
                                     prefix_lengths(batch.completion_mask, batch.attention_mask), pack)
        with torch.no_grad():
            want, got = _hidden(build(), packed, False), _hidden(build(), packed, True)
        real = packed.segments >= 0
        torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("build", [tiny_qwen2, tiny_llama])
@pytest.mark.parametrize("pack", [False, True])
def test_split_logprobs_and_gradients_equal_dense_and_the_separate_rows(monkeypatch, build, pack):
    """Through the learner's Forward: completion logprobs at T = 0.7 and the gradient of a weighted logprob sum, split
    against the dense mask and against the unshared rows (float32)."""
    batch = long_batch(1)
    weights = torch.linspace(-1.0, 1.0, batch.input_ids.numel()).view(batch.input_ids.shape)
    out, layouts = {}, []
    real = split_attention.split_attention_forward

    def spy(module, query, key, value, attention_mask, **kwargs):  # the layout reaches every attention call
        layouts.append(kwargs.get(split_attention.NAME))
        return real(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(split_attention, "split_attention_forward", spy)
    for name, fwd in (("rows", Forward(torch.device("cpu"), False, pack)),
                      ("dense", Forward(torch.device("cpu"), True, pack, "dense")),
                      ("split", Forward(torch.device("cpu"), True, pack, "split"))):
        model = build()
        logp = fwd.completion_logprobs(model, batch)
        (logp * weights).sum().backward()
        out[name] = (logp.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert len(layouts) == 2 and all(isinstance(x, SplitLayout) for x in layouts)  # 2 layers, one forward
    for ref in ("dense", "rows"):
        torch.testing.assert_close(out["split"][0], out[ref][0], rtol=1e-5, atol=1e-5)
        assert out["split"][1].keys() == out[ref][1].keys()
        for n, grad in out[ref][1].items():
            torch.testing.assert_close(out["split"][1][n], grad, rtol=1e-4, atol=1e-6, msg=n)
    assert max(float(g.abs().max()) for g in out["split"][1].values()) > 1e-3


def test_a_forward_without_a_layout_is_sdpa_bit_for_bit():
    """After the switch, forwards that pass no layout (SFT rows, a 2D padding mask) run transformers' SDPA and
    its mask function unchanged."""
    sdpa, split = tiny_qwen2(), tiny_qwen2()
    split_attention.ready(split)
    assert split.config._attn_implementation == split_attention.NAME
    ids = torch.randint(3, 250, (3, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 30:], mask[2, :5] = 0, 0  # right- and left-padded rows
    with torch.no_grad():
        for m in (None, mask):
            want = sdpa(input_ids=ids, attention_mask=m).logits
            assert torch.equal(split(input_ids=ids, attention_mask=m).logits, want)


def test_a_layout_that_does_not_fit_the_call_and_a_sliding_window_model_are_refused():
    packed = pack_shared_prompts(*_rows([([1, 2, 3], [4])])[:2], [3])
    layout = SplitLayout.of(packed, "cpu")
    model = tiny_qwen2()
    split_attention.ready(model)
    with torch.no_grad(), pytest.raises(ValueError, match="learner.attention=split: the layout has 1 lines of 4"):
        model.model(input_ids=torch.ones(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 1, 4, 4).bool(),
                    shop_r1_split=layout)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    sliding = Qwen2ForCausalLM(cfg)
    with pytest.raises(ValueError, match="learner.attention=split does not apply sliding windows"):
        split_attention.ready(sliding)
    # Through the learner's forward (split is the default) such a model gets the dense mask: the documented fallback.
    assert not split_attention.applies(sliding)
    batch = _grouped_batch(1)
    batch = dataclasses.replace(batch, input_ids=batch.input_ids % 64)  # the small model's vocabulary
    with torch.no_grad():
        got = Forward(torch.device("cpu"), True, False, "split").completion_logprobs(sliding, batch)
        want = Forward(torch.device("cpu"), True, False, "dense").completion_logprobs(sliding, batch)
    assert sliding.config._attn_implementation != split_attention.NAME
    torch.testing.assert_close(got, want, rtol=0, atol=0)
