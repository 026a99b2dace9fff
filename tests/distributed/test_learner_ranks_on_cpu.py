"""K learner ranks on Ray (gloo), each backend (learner.backend): for any batch size the ranks make the same
collective calls and the update is the one rank's, the exact global token mean."""

import pytest
import torch

from shop_r1.algo.batch import GRPOBatch
from shop_r1.config import LearnerConfig, RLConfig

BACKENDS = ["deepspeed", "fsdp2"]


def _batch(lengths, seed, temperature=0.6):
    """Rows of a 5-token prompt + lengths[b] completion tokens, random ids and advantages."""
    g = torch.Generator().manual_seed(seed)
    width = 5 + max(lengths)
    ids = torch.randint(3, 200, (len(lengths), width), generator=g)
    comp = torch.zeros(len(lengths), width, dtype=torch.long)
    attn = torch.zeros_like(comp)
    for b, n in enumerate(lengths):
        comp[b, 5:5 + n] = 1
        attn[b, :5 + n] = 1
    adv = torch.randn(len(lengths), generator=g, dtype=torch.float64)
    return GRPOBatch(ids, attn, comp, torch.zeros_like(comp), adv, torch.zeros(len(lengths), width),
                     temperature=temperature)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_give_the_one_rank_update_for_any_batch_size(ray_local_cluster, tiny_model_dir, backend):
    """2 ZeRO-2 ranks with 1, 3 and 5 responses (an empty share, uneven shares of uneven lengths) make the same
    number of collective calls (no hang) and the same global token-mean gradient as 1 rank on the whole batch.
    Before the fix: a rank with no responses divided by zero, and the loss was a mean of per-rank means."""
    from shop_r1.distributed.learner_group import LearnerGroup

    rl = RLConfig(kl_beta=0.1).loss_config(max_new_tokens=16)
    common = dict(backend=backend, zero_stage=2, num_cpus_per_rank=0.5, max_tokens_per_micro_batch=24)  # several
    one = LearnerGroup(str(tiny_model_dir), LearnerConfig(num_ranks=1, **common), 1e-6, 3, 0, local=False,
                       reference_path=str(tiny_model_dir))
    two = LearnerGroup(str(tiny_model_dir), LearnerConfig(num_ranks=2, **common), 1e-6, 3, 0, local=False,
                       reference_path=str(tiny_model_dir))
    try:
        for seed, lengths in enumerate(([7], [3, 9, 4], [2, 11, 6, 1, 8])):
            batch = _batch(lengths, seed)
            a = one.grpo_step(batch, rl)[0]
            b2 = two.grpo_step(batch, rl)
            assert b2[0] == b2[1]  # every rank reports the global figures
            b = b2[0]
            assert b.num_tokens == a.num_tokens == sum(lengths)
            assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4), lengths
            assert b.loss == pytest.approx(a.loss, rel=1e-4, abs=1e-7), lengths
            assert b.kl == pytest.approx(a.kl, rel=1e-3, abs=1e-9) and b.clip_fraction == a.clip_fraction
    finally:
        one.shutdown()
        two.shutdown()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ranks_with_shared_prompts_equal_one_rank_with_separate_rows(ray_local_cluster, tiny_model_dir, backend):
    """Shared-prompt packing on 2 ranks (a group split between them) against 1 rank running the separate rows:
    the same global loss, gradient norm and token count, for groups with prompts of mixed lengths."""
    from shop_r1.distributed.learner_group import LearnerGroup
    from tests.algo.test_shared_prompt_on_cpu import _grouped_batch

    rl = RLConfig(kl_beta=0.1).loss_config(max_new_tokens=16)
    common = dict(backend=backend, zero_stage=2, num_cpus_per_rank=0.5, max_tokens_per_micro_batch=40)
    separate = LearnerGroup(str(tiny_model_dir), LearnerConfig(num_ranks=1, shared_prompt=False, **common), 1e-6, 3,
                            0, local=False, reference_path=str(tiny_model_dir))
    shared = LearnerGroup(str(tiny_model_dir), LearnerConfig(num_ranks=2, shared_prompt=True, **common), 1e-6, 3, 0,
                          local=False, reference_path=str(tiny_model_dir))
    try:
        batch = _grouped_batch(3)
        # s(r) first (before the update moves the weights): each rank computes its own share's values.
        certainty = separate.rationale_self_certainty(batch, "p_to_u")
        assert shared.rationale_self_certainty(batch, "p_to_u") == pytest.approx(certainty, rel=1e-5, abs=1e-7)
        assert sum(v != 0 for v in certainty) >= 2
        a = separate.grpo_step(batch, rl)[0]
        b = shared.grpo_step(batch, rl)[0]
        assert a.num_tokens == b.num_tokens == 22
        # FSDP2 reports torch's float32 norm (clip_grad_norm_), rounded per shard on CPU: 2e-5 apart at 1 and 2
        # ranks on bitwise-equal gradients (5e-5 off the float64 norm for the embedding's alone).
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5 if backend == "deepspeed" else 1e-4)
        assert b.loss == pytest.approx(a.loss, rel=1e-5, abs=1e-8)
    finally:
        separate.shutdown()
        shared.shutdown()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", BACKENDS)
def test_self_certainty_on_two_zero3_ranks_equals_one_rank(request, backend):
    """Each rank receives and scores only its share of the responses. Under ZeRO-3 every forward and LM-head call is
    a collective: a rank whose rows hold no rationale token (rank 1 here) must still make as many calls as the
    other, and the ranks' shares take different numbers of micro-batches (rank 0's group packs into one, rank 1's two
    groups into two, at 24 or 40 tokens alike): no hang. The values come back in the batch's order, equal to one
    rank's. On the module's shared ZeRO-3 pair of the backend (below)."""
    import dataclasses

    from shop_r1.algo.batch import micro_batch_rows
    from tests.algo.test_shared_prompt_on_cpu import _grouped_batch

    batch = _grouped_batch(3)
    rationale = batch.rationale_mask.clone()
    rationale[3:] = 0  # rows 3-5 (rank 1's share) have none
    batch = dataclasses.replace(batch, rationale_mask=rationale)
    lengths = [int(n) for n in batch.attention_mask.sum(dim=1).tolist()]
    prompts = [(9, 0)] * 3 + [(14, 1)] * 2 + [(6, 2)]  # the groups' prompt lengths, as _grouped_batch builds them
    budget = ZERO3_UPDATE["max_tokens_per_micro_batch"]
    assert [len(micro_batch_rows(lengths[r], budget, prompts[r])) for r in (slice(0, 3), slice(3, 6))] == [1, 2]
    one, two = request.getfixturevalue(f"zero3_{backend}_pair")
    a = one.rationale_self_certainty(batch, "u_to_p")
    b = two.rationale_self_certainty(batch, "u_to_p")
    assert len(b) == 6 and b[3:] == [0.0, 0.0, 0.0] and sum(v != 0 for v in a) == 2
    assert b == pytest.approx(a, rel=1e-5, abs=1e-7)


ZERO3_UPDATE = dict(zero_stage=3, num_cpus_per_rank=0.5, max_tokens_per_micro_batch=40)
"""The learner settings of the two ZeRO-3 update tests below (40 tokens: their micro-batch splits)."""


def _zero3_pair(tiny_model_dir, backend):
    from shop_r1.distributed.learner_group import LearnerGroup

    return tuple(LearnerGroup(str(tiny_model_dir), LearnerConfig(num_ranks=k, backend=backend, **ZERO3_UPDATE), 1e-6,
                              10, 0, local=False, reference_path=str(tiny_model_dir)) for k in (1, 2))


def _module_pair(tiny_model_dir, backend):
    pair = _zero3_pair(tiny_model_dir, backend)
    yield pair
    for group in pair:
        group.shutdown()


@pytest.fixture(scope="module")
def zero3_deepspeed_pair(ray_local_cluster, tiny_model_dir):
    """A 1-rank and a 2-rank ZeRO-3 DeepSpeed group (the reference loaded), shared by the module's DeepSpeed ZeRO-3
    cases (the self-certainty case and the three update cases): two actor groups started instead of eight. Each case
    compares the two groups after the same earlier updates; at lr 1e-6 Adam's first steps, which amplify a near-zero
    gradient's rounding to +-lr, leave the groups' weights within ~1e-6 of each other, far inside the cases' 1e-5
    tolerances."""
    yield from _module_pair(tiny_model_dir, "deepspeed")


@pytest.fixture(scope="module")
def zero3_fsdp2_pair(ray_local_cluster, tiny_model_dir):
    """The same pair on FSDP2, shared by the module's two FSDP2 ZeRO-3 cases."""
    yield from _module_pair(tiny_model_dir, "fsdp2")


@pytest.fixture
def zero3_update_pair(request):
    """The module's shared pair of the requested backend."""
    return request.getfixturevalue(f"zero3_{request.param}_pair")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("zero3_update_pair, known", [("deepspeed", False), ("fsdp2", False), ("deepspeed", True)],
                         indirect=["zero3_update_pair"])
def test_self_certainty_from_the_update_on_two_zero3_ranks_equals_one_rank(zero3_update_pair, known):
    """reward.self_certainty.source=update_logits on Ray: rank 0 holds rows 0-2 (the dropped group 0 and one row of
    group 1), rank 1 rows 3-5; each places its share's s(r) among every response's, every rank computes the same
    advantages, and the update's figures equal one rank's. `known`: rl.self_certainty_breaks_ties=false, group 0
    dropped before s(r): rank 0 forwards it without gradient, rank 1 an empty micro-batch beside it (no hang)."""
    from shop_r1.config import RewardConfig
    from tests.learner.test_update_self_certainty_on_cpu import REWARDS, SPLIT, _batch

    rl = RLConfig(kl_beta=0.1, drop_zero_signal_groups=True, self_certainty_breaks_ties=not known)
    rewards = SPLIT if known else REWARDS
    loss, adv_cfg = rl.loss_config(max_new_tokens=16), rl.advantage_config(RewardConfig())
    one, two = zero3_update_pair
    (a,) = one.grpo_step_with_self_certainty(_batch(), loss, rewards, adv_cfg)
    b = two.grpo_step_with_self_certainty(_batch(), loss, rewards, adv_cfg)
    assert len(b) == 2 and all(x.updated for x in (a, *b))
    _assert_every_rank_equals_one(a, b, rewards, adv_cfg)


@pytest.mark.timeout(900)
def test_learner_logits_in_one_call_on_two_zero3_ranks_equals_one_rank(zero3_deepspeed_pair):
    """reward.self_certainty.source=learner_logits in one learner call on Ray: every rank gets the whole batch, takes
    s(r) of its contiguous share (rank 0 rows 0-2, rank 1 rows 3-5), sums them, computes the advantages, then trains
    its share of the kept rows (group 0 dropped: rows 2-5 split 2 + 2); s(r), advantages and the update's figures
    equal one rank's."""
    from shop_r1.config import RewardConfig
    from tests.learner.test_update_self_certainty_on_cpu import REWARDS, _batch

    rl = RLConfig(kl_beta=0.1, drop_zero_signal_groups=True)
    loss, adv_cfg = rl.loss_config(max_new_tokens=16), rl.advantage_config(RewardConfig())
    one, two = zero3_deepspeed_pair
    (a,) = one.grpo_step_after_self_certainty(_batch(), loss, REWARDS, adv_cfg, False)
    b = two.grpo_step_after_self_certainty(_batch(), loss, REWARDS, adv_cfg, False)
    assert len(b) == 2 and all(x.updated for x in (a, *b))
    assert a.advantages.zero_signal.tolist() == [True, False, False]
    _assert_every_rank_equals_one(a, b, REWARDS, adv_cfg)


def _assert_every_rank_equals_one(one, ranks, rewards, adv_cfg):
    """Each rank's s(r), advantages and update figures equal the one rank's (20 trained tokens: groups 1 and 2).

    The advantages are checked as the one owner's formula (`totals_and_advantages`) on each side's own s(r), not
    against each other: in a group whose action rewards tie (REWARDS' group 1) they come from alpha * (s1 - s2)
    alone, which magnifies s(r)'s 1e-5 relative agreement by (s1 + s2) / |s1 - s2| (1.1e-5 seen on a loaded
    machine, after the module's earlier updates moved the two groups' weights ~1e-6 apart)."""
    from shop_r1.algo.step_rewards import totals_and_advantages

    for x in (one, *ranks):
        want = totals_and_advantages(rewards, adv_cfg, x.self_certainty).advantages
        torch.testing.assert_close(x.advantages.advantages, want.advantages, rtol=1e-9, atol=1e-12)
    for x in ranks:
        assert x.self_certainty == pytest.approx(one.self_certainty, rel=1e-5, abs=1e-7)
        assert x.advantages.zero_signal.tolist() == one.advantages.zero_signal.tolist()
        assert x.stats.num_tokens == one.stats.num_tokens == 20
        assert x.stats.loss == pytest.approx(one.stats.loss, rel=1e-5, abs=1e-9)
        assert x.stats.grad_norm == pytest.approx(one.stats.grad_norm, rel=1e-4)
