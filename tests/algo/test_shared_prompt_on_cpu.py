"""Shared-prompt packing: the layout by hand, the micro-batch budget by hand, and on the real learner the same
logprobs, self-certainty, loss and gradients as the separate rows (K ranks: tests/distributed/test_learner_ranks)."""

import pytest
import torch

from shop_r1.algo.batch import GRPOBatch, micro_batch_rows
from shop_r1.algo.shared_prompt import pack_shared_prompts, prefix_lengths
from shop_r1.config import LearnerConfig, RLConfig


def _rows(rows: list[tuple[list[int], list[int]]]):
    """(prompt, completion) pairs -> right-padded ids, attention and completion masks."""
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn, comp = torch.zeros_like(ids), torch.zeros_like(ids)
    for b, (p, c) in enumerate(rows):
        ids[b, :len(p) + len(c)] = torch.tensor(p + c)
        attn[b, :len(p) + len(c)] = 1
        comp[b, len(p):len(p) + len(c)] = 1
    return ids, attn, comp


def random_groups(seed: int, count: int, prompt_tokens: tuple[int, int] = (0, 6),
                  completion_tokens: tuple[int, int] = (0, 5), pad: tuple[int, int] = (0, 1)):
    """`count` random batches of GRPO rows: 1-3 prompts of [lo, hi) tokens, 1-7 rows each continuing one of them
    with [lo, hi) completion tokens, right-padded with [lo, hi) extra columns. Yields (rows, ids, attention mask,
    completion mask)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))  # noqa: E731
    for _ in range(count):
        prompts = [torch.randint(1, 50, (rand(*prompt_tokens),), generator=g).tolist() for _ in range(rand(1, 4))]
        completion = lambda: torch.randint(1, 50, (rand(*completion_tokens),), generator=g).tolist()  # noqa: E731
        rows = [(prompts[rand(0, len(prompts))], completion()) for _ in range(rand(1, 8))]
        extra = rand(*pad)
        ids, attn, comp = (torch.nn.functional.pad(t, (0, extra)) for t in _rows(rows))
        yield rows, ids, attn, comp


def test_source_maps_every_row_token_to_the_state_of_its_predecessor_on_random_batches():
    """Random groups, prompts (empty ones too), completions (empty ones too) and extra padding columns: the packed
    token, position and segment at source[b, t] are row b's token t - 1, its position t - 1, and the prompt (for
    t - 1 in the prompt) or row b's own completion segment, for every real t >= 1; -1 elsewhere."""
    # At least one padding column: a batch is never 0 wide.
    for rows, ids, attn, comp in random_groups(0, 300, pad=(1, 4)):
        prefixes = prefix_lengths(comp, attn)
        assert prefixes == [len(p) for p, _ in rows]
        packed = pack_shared_prompts(ids, attn, prefixes)
        flat_ids, flat_pos = packed.input_ids.flatten(), packed.position_ids.flatten()
        flat_seg = packed.segments.flatten()
        for b, (p, c) in enumerate(rows):
            n = len(p) + len(c)
            src = packed.source[b]
            assert src[0] == -1 and (src[max(n, 1):] == -1).all()
            assert flat_ids[src[1:n]].tolist() == ids[b, :max(n - 1, 0)].tolist()
            assert flat_pos[src[1:n]].tolist() == list(range(n - 1))
            segs = flat_seg[src[1:n]].tolist()
            assert all(s == 0 for s in segs[:len(p)]) and len(set(segs[len(p):])) <= 1 and 0 not in segs[len(p):]
        completion_segments = [int(flat_seg[packed.source[b][len(p) + 1]]) for b, (p, c) in enumerate(rows)
                               if len(c) > 1]
        packs = [int(packed.source[b][len(p) + 1]) // packed.input_ids.shape[1] for b, (p, c) in enumerate(rows)
                 if len(c) > 1]
        assert len(set(zip(packs, completion_segments))) == len(packs)  # no two rows share a completion segment


def test_pack_lays_each_prompt_out_once_and_maps_every_row_position_back():
    ids, attn, comp = _rows([([5, 6, 7], [8, 9]), ([4], [3]), ([5, 6, 7], [10])])
    assert prefix_lengths(comp, attn) == [3, 1, 3]
    packed = pack_shared_prompts(ids, attn, [3, 1, 3])
    # Pack 0: prompt 5 6 7, then row 0's completion (segment 1), then row 2's (segment 2). Pack 1: row 1.
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 10], [4, 3, 0, 0, 0, 0]]
    assert packed.segments.tolist() == [[0, 0, 0, 1, 1, 2], [0, 1, -1, -1, -1, -1]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 0, 0, 0, 0]]  # row 2's 10 sits at 3 again
    allowed = packed.allowed[0, 0].int().tolist()
    assert allowed[5] == [1, 1, 1, 0, 0, 1]  # row 2's token sees the prompt and itself, not row 0's completion
    assert allowed[4] == [1, 1, 1, 1, 1, 0]  # row 0's second token: prompt + its own first token
    assert allowed[2] == [1, 1, 1, 0, 0, 0]  # prompt stays causal
    assert packed.allowed[1, 0, 3].int().tolist() == [0, 0, 0, 1, 0, 0]  # padding sees itself only
    # source[b, t]: flat index (pack * 6 + position) of the state that predicts row token t (the one at t - 1).
    assert packed.source.tolist() == [[-1, 0, 1, 2, 3], [-1, 6, -1, -1, -1], [-1, 0, 1, 2, -1]]
    assert packed.num_tokens == 8  # 11 real row tokens, the shared prompt counted once
    mask = packed.additive_mask(torch.float32)
    assert mask[0, 0, 5, 3] == torch.finfo(torch.float32).min and mask[0, 0, 5, 2] == 0


def test_micro_batches_fill_a_token_budget_counted_as_the_forward_runs():
    lengths = [10, 12, 11, 4, 20]
    # Separate rows: cost = rows x longest row. [10, 12] = 24, + 11 = 36 > 30; [11, 4] = 22, + 20 = 60; [20].
    assert micro_batch_rows(lengths, 30) == [[0, 1], [2, 3], [4]]
    # Rows 0-2 share an 8-token prompt, 3 and 4 have their own: packs cost 8 + 2 + 4 + 3 = 17 for rows 0-2,
    # then row 3 adds a pack of 4: 2 packs x 17 = 34 > 30, a new micro-batch; [3, 4] = 2 x 20 = 40 > 30.
    prompts = [(8, "a"), (8, "a"), (8, "a"), (2, "b"), (15, "c")]
    assert micro_batch_rows(lengths, 30, prompts) == [[0, 1, 2], [3], [4]]
    assert micro_batch_rows(lengths, 1) == [[0], [1], [2], [3], [4]]  # a row over the budget is its own


def _grouped_batch(seed: int, temperature: float = 0.6) -> GRPOBatch:
    """Three groups with prompts of 9, 14 and 6 tokens and 3, 2 and 1 completions of mixed lengths."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, 200, (n,), generator=g).tolist()  # noqa: E731
    rows = []
    for prompt_len, completions in ((9, (4, 7, 1)), (14, (5, 3)), (6, (2,))):
        prompt = rand(prompt_len)
        rows += [(prompt, rand(n)) for n in completions]
    ids, attn, comp = _rows(rows)
    rat = comp.clone()
    rat[:, :10] = 0  # a rationale span that starts inside some completions
    adv = torch.randn(len(rows), generator=g, dtype=torch.float64)
    return GRPOBatch(ids, attn, comp, rat, adv, torch.zeros(ids.shape), temperature=temperature)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend, attention", [("deepspeed", "dense"), ("fsdp2", "dense"), ("deepspeed", "split"),
                                                ("fsdp2", "split")])
def test_shared_prompt_learner_equals_separate_rows(tiny_model_dir, backend, attention):
    """Packed and separate forwards on the real learner: same logprobs at T = 0.6, same exact self-certainty, same
    gradient of a weighted logprob sum (1e-5, fp32), and the same GRPO step statistics with KL to a reference; the
    packed lines through the dense mask, or split into SDPA pieces (learner.attention=split: policy and reference)."""
    from torch.distributed.tensor import DTensor

    from shop_r1.learner.grpo_step import forward_of
    from shop_r1.learner.rank import LearnerRank

    batch = _grouped_batch(0)
    learners = [LearnerRank(str(tiny_model_dir), LearnerConfig(backend=backend, zero_stage=0, shared_prompt=shared,
                                                               attention=attention, max_tokens_per_micro_batch=64),
                            lr=1e-4, total_steps=2, reference_path=str(tiny_model_dir))
                for shared in (True, False)]
    packed, separate = learners
    a, b = packed.probe_logprobs(batch), separate.probe_logprobs(batch)
    assert [len(x) for x in a] == [len(x) for x in b] == [4, 7, 1, 5, 3, 2]
    assert max(abs(x - y) for r, s in zip(a, b) for x, y in zip(r, s)) < 1e-5
    sc = [m.rationale_self_certainty(batch, "u_to_p") for m in learners]
    assert sc[0] == pytest.approx(sc[1], rel=1e-5, abs=1e-6) and sum(v != 0 for v in sc[0]) >= 2
    # Gradients: the same weighted sum of completion logprobs through each path, one micro-batch each.
    weights = torch.linspace(-1.0, 1.0, batch.input_ids.numel()).view(batch.input_ids.shape)
    grads = []
    for m in learners:
        # FSDP2: sharded, its grads DTensors
        module = m.backend.engine.module if backend == "deepspeed" else m.backend.module
        module.zero_grad(set_to_none=True)
        (forward_of(m).completion_logprobs(m.policy, batch) * weights).sum().backward()
        grads.append({n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()
                      for n, p in module.named_parameters()})
        module.zero_grad(set_to_none=True)
    for name, grad in grads[1].items():
        assert torch.allclose(grads[0][name], grad, rtol=1e-5, atol=1e-6), name
    assert max(float(g.abs().max()) for g in grads[0].values()) > 1e-3  # the gradient is not trivially zero
    stats = [m.grpo_step(batch, RLConfig(kl_beta=0.1).loss_config(max_new_tokens=16)) for m in learners]
    assert stats[0].num_tokens == stats[1].num_tokens == 22
    assert stats[0].loss == pytest.approx(stats[1].loss, rel=1e-5, abs=1e-8)
    assert stats[0].grad_norm == pytest.approx(stats[1].grad_norm, rel=1e-5)
    assert stats[0].kl == pytest.approx(stats[1].kl, rel=1e-4, abs=1e-10)
    if attention == "split":  # the packed learner's policy and reference really ran the split pieces
        assert packed.policy.config._attn_implementation == "shop_r1_split"
        assert packed.reference.config._attn_implementation == "shop_r1_split"
