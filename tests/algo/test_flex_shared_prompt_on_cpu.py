"""learner.attention=flex: the shared-prompt mask as a FlexAttention BlockMask. Here, on CPU: the BlockMask is the
dense mask at every (query, key), it skips the blocks counted by hand, and a tiny Qwen2 given it (flex_attention
run uncompiled, without gradients) computes the dense mask's hidden states. torch 2.13's FlexAttention has no CPU
backward, so the flex path is CUDA only (elsewhere an error naming the key); its logprobs and gradients against the
dense mask and the separate rows: tests/gpu/test_flex_shared_prompt_gpu.py."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from shop_r1.algo.batch import GRPOBatch
from shop_r1.algo.shared_prompt import pack_shared_prompts, prefix_lengths
from shop_r1.learner.forward import Forward
from tests.algo.test_shared_prompt_on_cpu import _grouped_batch, _rows, random_groups


def tiny_qwen2(seed: int = 0, device: str = "cpu"):
    """A random 2-layer Qwen2 (head_dim 32, grouped KV heads), float32, built in code."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                      attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg).to(device).float()


def long_batch(seed: int, prompt_len: int = 300, completions: tuple[int, ...] = (170, 40, 129, 1)) -> GRPOBatch:
    """Two groups: one with a `prompt_len`-token prompt and completions spanning several 128-token blocks (so the
    BlockMask has blocks to skip), one short; T = 0.7."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, 250, (n,), generator=g).tolist()  # noqa: E731
    prompt, short = rand(prompt_len), rand(20)
    ids, attn, comp = _rows([(prompt, rand(n)) for n in completions] + [(short, rand(9)), (short, rand(5))])
    adv = torch.randn(ids.shape[0], generator=g, dtype=torch.float64)
    return GRPOBatch(ids, attn, comp, comp.clone(), adv, torch.zeros(ids.shape), temperature=0.7)


@pytest.mark.parametrize("pack", [False, True])
def test_block_mask_is_the_dense_mask_at_every_pair_on_random_batches(pack):
    """Random groups, prompts and completions (empty ones too), with and without sequence packing: the BlockMask's
    mask_mod, evaluated at every (line, query, key), is `allowed` exactly."""
    for _, ids, attn, comp in random_groups(1, 40, prompt_tokens=(0, 7), completion_tokens=(0, 6), pad=(1, 3)):
        packed = pack_shared_prompts(ids, attn, prefix_lengths(comp, attn), pack)
        lines, width = packed.segments.shape
        dense = create_mask(packed.block_mask("cpu").mask_mod, lines, 1, width, width, device="cpu")
        assert torch.equal(dense, packed.allowed)


def test_block_mask_skips_the_blocks_no_query_sees():
    """A 256-token prompt and three 256-token completions: one 1,024-wide line of 8 x 8 blocks of 128. By hand, the
    blocks computed: the prompt's 2 query blocks see 1 + 2 key blocks (causal); each completion's 2 query blocks see
    the 2 prompt blocks and 1 + 2 of their own: 4 + 3 = 7. 3 + 3 x 7 = 24 of 64 blocks, where the dense mask
    computes all 64 and causal SDPA 36."""
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(1, 50, (256,), generator=g).tolist()
    ids, attn, comp = _rows([(prompt, torch.randint(1, 50, (256,), generator=g).tolist()) for _ in range(3)])
    packed = pack_shared_prompts(ids, attn, prefix_lengths(comp, attn))
    blocks = packed.block_mask("cpu").to_dense()[0, 0]  # [8, 8] query block x key block, 1 where computed
    assert int(blocks.sum()) == 24
    assert blocks[5].tolist() == [1, 1, 0, 0, 1, 1, 0, 0]  # completion 2's second block: prompt + its own two


def _eager_flex(monkeypatch):
    """transformers compiles flex_attention on first use; torch 2.13's compiled CPU forward fails to build once shapes
    change (the reason learner.attention=flex is CUDA only), so on CPU the same call runs uncompiled."""
    import transformers.integrations.flex_attention as hf_flex
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention",
                        lambda query, key, value, training=False, **kwargs: flex_attention(query, key, value, **kwargs))


@pytest.mark.parametrize("pack", [False, True])
def test_qwen2_takes_the_block_mask_and_gives_the_dense_masks_hidden_states(monkeypatch, pack):
    """transformers 5's Qwen2 with attn_implementation=flex_attention takes the BlockMask as its attention_mask (a 4D
    mask is passed through as is) with the packed position ids: every hidden state equals the dense mask's (float32,
    1e-5, no gradients: torch has no CPU flex backward). With the dense path's own test against the separate rows
    (tests/algo/test_shared_prompt_on_cpu.py), the flex logprobs equal the rows'; with gradients on CUDA in
    tests/gpu/test_flex_shared_prompt_gpu.py."""
    _eager_flex(monkeypatch)
    for batch in (long_batch(0), _grouped_batch(3)):
        packed = pack_shared_prompts(batch.input_ids, batch.attention_mask,
                                     prefix_lengths(batch.completion_mask, batch.attention_mask), pack)
        inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids}
        dense, flex = tiny_qwen2(), tiny_qwen2()
        flex.set_attn_implementation("flex_attention")
        with torch.no_grad():
            want = dense.model(**inputs, attention_mask=packed.additive_mask(torch.float32)).last_hidden_state
            got = flex.model(**inputs, attention_mask=packed.block_mask("cpu")).last_hidden_state
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_flex_off_cuda_is_an_error_naming_the_key():
    with torch.no_grad(), pytest.raises(ValueError, match="learner.attention=flex needs CUDA"):
        Forward(torch.device("cpu"), True, False, "flex").completion_logprobs(tiny_qwen2(), _grouped_batch(0))
