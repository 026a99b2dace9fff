"""Sequence packing (shop_r1/algo/packing.py): the layout and the micro-batch budget by hand, and on a tiny random
Qwen2 the same logprobs, GRPO loss and gradients as the padded rows, with and without shared-prompt encoding."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from shop_r1.algo.batch import GRPOBatch, micro_batch_rows
from shop_r1.algo.packing import first_fit_decreasing
from shop_r1.algo.shared_prompt import pack_rows, pack_shared_prompts, prefix_lengths
from shop_r1.config import LearnerConfig, RLConfig
from shop_r1.learner.forward import Forward
from shop_r1.learner.grpo_step import grpo_update, micro_batches
from tests.algo.test_shared_prompt_on_cpu import _rows, random_groups
from tests.learner.test_grpo_step_on_cpu import TorchBackend

CPU = torch.device("cpu")


def test_first_fit_decreasing_by_hand():
    # Longest first: 9 opens line 0 (room 1), 6 opens line 1 (room 4), 4 fills line 1, 3 opens line 2, 1 fits line 0.
    assert first_fit_decreasing([4, 9, 1, 6, 3], 10) == [[1, 2], [3, 0], [4]]
    assert first_fit_decreasing([], 5) == []
    with pytest.raises(ValueError, match="does not fit"):
        first_fit_decreasing([6], 5)


def test_a_two_sequence_pack_by_hand():
    """Rows of 5, 3 and 2 tokens: lines as wide as the longest (5), so row 0 fills line 0 and rows 1 and 2 share
    line 1, positions restarting at 0, each attending causally within itself only."""
    ids, attn, _ = _rows([([1, 2, 3, 4, 5], []), ([6, 7, 8], []), ([9, 10], [])])
    packed = pack_rows(ids, attn)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert packed.blocks.tolist() == [[0, 0, 0, 0, 0], [1, 1, 1, 2, 2]]
    assert packed.allowed[1, 0].int().tolist() == [[1, 0, 0, 0, 0],
                                                    [1, 1, 0, 0, 0],
                                                    [1, 1, 1, 0, 0],
                                                    [0, 0, 0, 1, 0],   # row 2's first token: itself, not row 1
                                                    [0, 0, 0, 1, 1]]
    assert packed.allowed[0, 0].int().tolist() == torch.ones(5, 5, dtype=torch.int).tril().tolist()
    # source[b, t]: flat index (line * 5 + column) of the state predicting row token t.
    assert packed.source.tolist() == [[-1, 0, 1, 2, 3], [-1, 5, 6, -1, -1], [-1, 8, -1, -1, -1]]
    assert packed.num_positions == 10 and packed.num_tokens == 10  # padded: 3 rows x 5 = 15 positions
    mask = packed.additive_mask(torch.float32)
    assert mask[1, 0, 3, 2] == torch.finfo(torch.float32).min and mask[1, 0, 4, 3] == 0


def test_shared_prompt_packs_share_a_line_each_keeping_its_own_mask():
    """Pack 0 = prompt 5 6 7 + completions (8 9) and (10): 6 wide; pack 1 = (4 | 3) and pack 2 = (1 2 | 11 12)
    fit one line together (2 + 4 <= 6)."""
    ids, attn, comp = _rows([([5, 6, 7], [8, 9]), ([4], [3]), ([5, 6, 7], [10]), ([1, 2], [11, 12])])
    packed = pack_shared_prompts(ids, attn, prefix_lengths(comp, attn), pack=True)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 10], [1, 2, 11, 12, 4, 3]]
    assert packed.segments.tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 1, 1, 0, 1]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 0, 1]]
    assert packed.allowed[1, 0].int().tolist() == [[1, 0, 0, 0, 0, 0],
                                                    [1, 1, 0, 0, 0, 0],
                                                    [1, 1, 1, 0, 0, 0],
                                                    [1, 1, 1, 1, 0, 0],
                                                    [0, 0, 0, 0, 1, 0],  # pack 1's prompt: not pack 2's tokens
                                                    [0, 0, 0, 0, 1, 1]]
    assert packed.source[1].tolist() == [-1, 10, -1, -1, -1]  # row 1's 3 is predicted by its prompt's 4
    assert packed.num_positions == 12 < pack_shared_prompts(ids, attn, prefix_lengths(comp, attn)).num_positions


@pytest.mark.parametrize("shared", [False, True])
def test_every_row_token_sees_exactly_its_own_row_on_random_batches(shared):
    """Random groups, prompts and completions (empty ones too): for every real row token t - 1, the packed state at
    source[b, t] holds that token at position t - 1 and attends to exactly row b's tokens 0..t-1."""
    for rows, ids, attn, comp in random_groups(1, 150, prompt_tokens=(1, 9), completion_tokens=(0, 6)):
        packed = pack_shared_prompts(ids, attn, prefix_lengths(comp, attn), pack=True) if shared \
            else pack_rows(ids, attn)
        width = packed.input_ids.shape[1]
        flat_ids, flat_pos = packed.input_ids.flatten(), packed.position_ids.flatten()
        for b, (p, c) in enumerate(rows):
            n, src = len(p) + len(c), packed.source[b]
            assert flat_ids[src[1:n]].tolist() == ids[b, :n - 1].tolist()
            assert flat_pos[src[1:n]].tolist() == list(range(n - 1))
            for t in range(1, n):
                line, q = divmod(int(src[t]), width)
                keys = packed.allowed[line, 0, q].nonzero().flatten().tolist()
                assert keys == sorted(int(s) % width for s in src[1:t + 1]) and all(
                    int(s) // width == line for s in src[1:t + 1])
        padded = pack_shared_prompts(ids, attn, prefix_lengths(comp, attn)).num_positions if shared \
            else len(rows) * int(attn.sum(dim=1).max())
        assert packed.num_positions <= padded


def test_micro_batches_count_packed_lines_against_the_budget():
    lengths = [20, 5, 8, 6, 12]
    # Padded: [20, 5] = 2 x 20 = 40; + 8 = 60 > 40, cut; [8, 6] = 16, + 12 = 3 x 12 = 36.
    assert micro_batch_rows(lengths, 40) == [[0, 1], [2, 3, 4]]
    # Packed, lines as wide as the longest: [20 | 8 5] = 2 x 20 = 40; + 6: [20 | 8 6 5] = 40; + 12:
    # [20 | 12 8 | 6 5] = 3 x 20 = 60 > 40, cut.
    assert micro_batch_rows(lengths, 40, pack=True) == [[0, 1, 2, 3], [4]]
    # Shared prompts a (rows 0-1: 8 + 4 + 2 = 14 wide), b (rows 2-3: 2 + 3 + 2 = 7), c (row 4: 6).
    lengths, prompts = [12, 10, 5, 4, 6], [(8, "a"), (8, "a"), (2, "b"), (2, "b"), (3, "c")]
    # Padded packs: [a b] = 2 x 14 = 28; + c = 3 x 14 = 42 > 28, cut. Packed: [a | b c] = 2 x 14 = 28.
    assert micro_batch_rows(lengths, 28, prompts) == [[0, 1, 2, 3], [4]]
    assert micro_batch_rows(lengths, 28, prompts, pack=True) == [[0, 1, 2, 3, 4]]
    assert micro_batch_rows(lengths, 1, pack=True) == [[0], [1], [2], [3], [4]]  # a row over the budget is its own


# ------------------------------------------------------------------------ a tiny random Qwen2, built in code


def _tiny_qwen(attn: str, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         attn_implementation=attn)
    return Qwen2ForCausalLM(config).to(torch.float32)


def _uneven_batch(seed: int = 0, temperature: float = 0.7) -> GRPOBatch:
    """Four groups, prompts of 3, 41, 9 and 22 tokens, with 3, 2, 3 and 1 completions of 1 to 9 tokens."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, 96, (n,), generator=g).tolist()  # noqa: E731
    rows = []
    for prompt_len, completions in ((3, (4, 9, 1)), (41, (5, 3)), (9, (2, 7, 6)), (22, (8,))):
        prompt = rand(prompt_len)
        rows += [(prompt, rand(n)) for n in completions]
    ids, attn, comp = _rows(rows)
    rat = comp.clone()
    rat[:, :12] = 0
    adv = torch.randn(len(rows), generator=g, dtype=torch.float64)
    sampler = torch.randn(ids.shape, generator=g).clamp(max=0) * comp
    return GRPOBatch(ids, attn, comp, rat, adv, sampler, temperature=temperature)


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def models(request):
    policy = _tiny_qwen(request.param, seed=0)
    reference = _tiny_qwen(request.param, seed=1).eval().requires_grad_(False)
    return policy, reference


@pytest.mark.parametrize("shared", [False, True])
def test_packed_forward_gives_the_padded_logprobs_and_computes_fewer_positions(models, shared):
    policy, _ = models
    batch = _uneven_batch()
    positions = []
    hook = policy.model.embed_tokens.register_forward_hook(lambda m, i, o: positions.append(i[0].numel()))
    try:
        padded = Forward(CPU, shared, pack=False).completion_logprobs(policy, batch)
        packed = Forward(CPU, shared, pack=True).completion_logprobs(policy, batch)
        certainty = [Forward(CPU, shared, pack).rationale_self_certainty(policy, batch, "p_to_u") for pack in (0, 1)]
    finally:
        hook.remove()
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-6)
    assert int((packed != 0).sum()) == int(batch.completion_mask[:, 1:].sum())  # every completion token scored
    assert certainty[1] == pytest.approx(certainty[0], rel=1e-5, abs=1e-6)
    # Rows of 7, 12, 4, 46, 44, 11, 16, 15, 30 tokens: padded 9 x 46; packed [46 | 44 | 30 16 | 15 12 11 7 | 4],
    # 5 x 46. Shared packs of 17, 49, 24, 30: padded 4 x 49; packed [49 | 30 17 | 24], 3 x 49.
    assert positions[:2] == ([4 * 49, 3 * 49] if shared else [9 * 46, 5 * 46])


@pytest.mark.parametrize(("shared", "budget", "counts"), [
    (False, 10_000, [1, 1]), (True, 10_000, [1, 1]),
    # Rows 7, 12, 4, 46, 44, 11, 16, 15, 30 tokens. Padded: [7 12 4] [46 44] [11 16 15] [30]; packed, lines as
    # wide as the longest: [46 | 12 7 4] [44 | 16 15 11] [30].
    (False, 100, [4, 3]),
    # Packs of 17, 46 -> 49, 24 and 30 tokens: [17 49] (2 x 49) [24 30] (2 x 30) either way.
    (True, 100, [2, 2])])
def test_packed_grpo_step_gives_the_padded_loss_and_gradients(models, shared, budget, counts):
    """The whole step (micro-batches, global denominators, KL to a reference, the loss) padded vs packed: the same
    loss, statistics and parameter gradients (fp32), in one micro-batch or split by a token budget."""
    policy, reference = models
    batch = _uneven_batch(seed=3)
    cfg = RLConfig(loss="grpo", kl_beta=0.1).loss_config(max_new_tokens=16)
    stats, grads, made = [], [], []
    for pack in (False, True):
        backend = TorchBackend(policy, LearnerConfig(shared_prompt=shared, max_tokens_per_micro_batch=budget),
                               reference)
        made.append(len(micro_batches(backend, batch, pack)))
        stats.append(grpo_update(backend, batch, cfg, step=1, pack=pack))
        (g,) = backend.grads
        grads.append(g)
    assert stats[0].num_tokens == stats[1].num_tokens == int(batch.completion_mask.sum())
    assert stats[1].loss == pytest.approx(stats[0].loss, rel=1e-5, abs=1e-7)
    assert stats[1].kl == pytest.approx(stats[0].kl, rel=1e-4, abs=1e-9)
    assert stats[1].grad_norm == pytest.approx(stats[0].grad_norm, rel=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6, msg=name)
    assert max(float(g.abs().max()) for g in grads[0].values()) > 1e-4  # not trivially zero
    assert made == counts


def test_rows_that_pack_no_tighter_run_as_they_are(models):
    """Rows of 46 and 44 tokens take as many lines packed as padded: the forward runs them unpacked, bit for bit."""
    policy, _ = models
    batch = _uneven_batch().select([3, 4])  # the 41-token prompt's two completions: 46 and 44 tokens
    assert first_fit_decreasing([46, 44], 46) == [[0], [1]]
    padded = Forward(CPU, pack=False).completion_logprobs(policy, batch)
    assert torch.equal(Forward(CPU, pack=True).completion_logprobs(policy, batch), padded)
