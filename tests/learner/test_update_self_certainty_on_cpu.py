"""reward.self_certainty.source=update_logits against today's path (learner_logits), on the tiny random Qwen2: one
GRPO step whose own forward gives s(r) gives the same s(r), advantages, zero-signal groups, step figures and
gradient (plain-torch backend) or updated weights (DeepSpeed ZeRO-2/3 and FSDP2 on CPU) as the extra no-grad forward
followed by the update of the selected batch. The batch: 3 groups x 2 samples sampled at T = 0.6 (s(r) must come
from the unscaled logits), one group zero-signal and dropped (rl.drop_zero_signal_groups), several micro-batches,
a reference that differs from the policy (KL), one-step-off importance weights (sampler logprobs != learner's)."""

import copy
import dataclasses
import pickle
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from shop_r1.algo.batch import GRPOBatch
from shop_r1.algo.step_rewards import StepRewards, kept_rows, step_advantages
from shop_r1.config import LearnerConfig, RewardConfig, RLConfig
from shop_r1.learner.grpo_step import (
    grpo_update,
    grpo_update_after_self_certainty,
    grpo_update_with_self_certainty,
    micro_batches,
    rationale_self_certainty,
)
from shop_r1.types import RewardBreakdown
from tests.algo.test_shared_prompt_on_cpu import _rows
from tests.learner.test_grpo_step_on_cpu import TorchBackend

TEMPERATURE = 0.6
INVALID = RewardBreakdown()  # format-invalid: total 0 whatever s(r) is (its s(r) is not applied)
HIT = RewardBreakdown(format=0.5, action_type=0.3, attribute=0.2, value=1000.0, total=1001.0, format_valid=True)
TYPE_ONLY = RewardBreakdown(format=0.5, action_type=0.3, total=0.8, format_valid=True)
# Group 0 ties (both invalid: zero-signal, dropped); group 1's action rewards tie, s(r) breaks the tie (the paper's
# rule); group 2 differs by its action reward.
REWARDS = StepRewards(((INVALID, INVALID), (HIT, HIT), (TYPE_ONLY, HIT)), target_types=(0, 0, 1))
# With rl.self_certainty_breaks_ties=false: group 0's action rewards tie (dropped, known before s(r); format-valid,
# so its s(r) still moves its totals, which rl.scale_rewards=batch's std reads); groups 1 and 2 differ and train.
SPLIT = StepRewards(((HIT, HIT), (TYPE_ONLY, HIT), (HIT, TYPE_ONLY)), target_types=(0, 0, 1))


def _batch() -> GRPOBatch:
    """3 prompts (7, 11, 5 tokens) x 2 completions; the rationale is each completion but its last 2 tokens (row 4's
    completion of 2 tokens has none); the engine's logprobs random (one-step-off: not the learner's)."""
    g = torch.Generator().manual_seed(5)
    rand = lambda n: torch.randint(3, 200, (n,), generator=g).tolist()  # noqa: E731
    rows = []
    for prompt_len, completions in ((7, (6, 4)), (11, (5, 7)), (5, (2, 6))):
        prompt = rand(prompt_len)
        rows += [(prompt, rand(n)) for n in completions]
    ids, attn, comp = _rows(rows)
    rat = comp.clone()
    for b in range(len(rows)):
        last = int(comp[b].nonzero().max())
        rat[b, last - 1:] = 0
    sampler = torch.where(comp.bool(), -torch.rand(ids.shape, generator=g) * 3, torch.zeros(ids.shape))
    return GRPOBatch(ids, attn, comp, rat, torch.zeros(len(rows), dtype=torch.float64), sampler,
                     temperature=TEMPERATURE)


RL = RLConfig(kl_beta=0.1, async_level=1, drop_zero_signal_groups=True)
LOSS = RL.loss_config(max_new_tokens=16)
ADV = RL.advantage_config(RewardConfig())
NO_TIES = dataclasses.replace(ADV, self_certainty_breaks_ties=False)


def todays_path(backend, batch, pack=False, rewards=REWARDS, adv_cfg=ADV):
    """learner_logits: the extra no-grad forward for s(r), the advantages, the update of the selected rows."""
    values = rationale_self_certainty(backend, batch, "p_to_u", pack=pack)
    adv = step_advantages(rewards.with_self_certainty(values, adv_cfg.reward), adv_cfg)
    selected = batch.with_advantages(adv.advantages).select(kept_rows(adv, adv_cfg))
    return values, adv, grpo_update(backend, selected, LOSS, step=1, pack=pack)


@pytest.fixture(autouse=True)
def _deepspeed_world_group_of_this_process_group():
    """DeepSpeed keeps a clone of the world group (deepspeed.utils.groups._WORLD_GROUP) across learners; a test earlier
    in the session that re-made torch.distributed's default group (an in-process vLLM engine's shutdown, e.g.
    tests/learner/test_grpo_exact_on_cpu.py) leaves that clone unregistered, and the next DeepSpeed engine fails in
    its first broadcast ("Group ... is not registered"). Forget a clone the current group does not know."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    registered = dist.distributed_c10d._world.pg_group_ranks
    for name in ("_WORLD_GROUP", "_ZERO_PARAM_INTRA_PARALLEL_GROUP"):
        group = getattr(groups, name)
        if group is not None and group not in registered:
            setattr(groups, name, None)
    yield


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # a reference that differs from the policy, so the KL term has a value and a gradient
        for p in reference.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    ref_dir = tmp_path_factory.mktemp("reference")
    reference.save_pretrained(ref_dir)
    return policy, reference.requires_grad_(False), ref_dir


@pytest.mark.parametrize("shared_prompt, pack, count", [(True, False, 2), (False, False, 3), (True, True, 2)])
def test_the_update_gives_todays_self_certainty_advantages_and_gradient(models, shared_prompt, pack, count):
    policy, reference, _ = models
    batch = _batch()
    cfg = LearnerConfig(max_tokens_per_micro_batch=40, shared_prompt=shared_prompt, pack_sequences=pack)
    today, ours = TorchBackend(policy, cfg, reference), TorchBackend(policy, cfg, reference)
    assert len(micro_batches(ours, batch, pack)) == count  # (shared prompts: group 1 is split over both)
    values, adv, stats = todays_path(today, batch, pack)
    out = grpo_update_with_self_certainty(ours, batch, LOSS, REWARDS, ADV, first_row=0, step=1, pack=pack)
    assert out.updated and out.self_certainty == pytest.approx(values, rel=1e-6, abs=1e-9)
    assert values[4] == 0.0 and all(v > 0 for i, v in enumerate(values) if i != 4)  # row 4: no rationale token
    assert out.advantages.zero_signal.tolist() == adv.zero_signal.tolist() == [True, False, False]
    torch.testing.assert_close(out.advantages.advantages, adv.advantages, rtol=1e-6, atol=1e-9)
    assert float(adv.advantages[1].abs().min()) > 0.1  # s(r) broke group 1's tie (|A| < 1/sqrt(2): eps)
    # The same figures: the dropped group's 10 tokens train nothing; KL and the importance weights are real.
    assert out.stats.num_tokens == stats.num_tokens == 5 + 7 + 2 + 6  # groups 1 and 2's completion tokens
    for name in ("loss", "kl", "clip_fraction", "ratio_mean", "grad_norm", "sampler_logprob_abs_diff_mean",
                 "sampler_logprob_abs_diff_max", "is_weight_mean", "is_truncated_fraction"):
        assert getattr(out.stats, name) == pytest.approx(getattr(stats, name), rel=1e-5, abs=1e-9), name
    assert stats.kl > 0 and stats.is_weight_mean != 1.0
    # Every forward first, then one backward of the micro-batches' summed losses and one optimizer step: the same
    # gradient as today's backward per micro-batch.
    assert ours.calls == ["begin", "backward", "step"]  # one backward of the micro-batches' summed losses
    (got,), (expected,) = ours.grads, today.grads
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-7, msg=name)
    assert max(float(g.abs().max()) for g in expected.values()) > 1e-4


@pytest.mark.parametrize("shared_prompt, pack, rewards, adv_cfg", [(False, False, REWARDS, ADV),
                                                                 (True, True, SPLIT, NO_TIES)])
def test_learner_logits_in_one_call_is_todays_two_calls_to_the_bit(models, shared_prompt, pack, rewards, adv_cfg):
    """reward.self_certainty.source=learner_logits in one learner call (grpo_update_after_self_certainty: the no-grad
    s(r) forward of the whole batch, the advantages, the update of the kept rows) gives exactly what the driver's two
    calls gave (`todays_path`): the same forwards on the same rows, so the same s(r), advantages, figures and
    gradient, equal, not close."""
    policy, reference, _ = models
    batch = _batch()
    cfg = LearnerConfig(max_tokens_per_micro_batch=40, shared_prompt=shared_prompt, pack_sequences=pack)
    today, ours = TorchBackend(policy, cfg, reference), TorchBackend(policy, cfg, reference)
    values, adv, stats = todays_path(today, batch, pack, rewards, adv_cfg)
    out = grpo_update_after_self_certainty(ours, batch, LOSS, rewards, adv_cfg, action_only=False, rank=0,
                                           world_size=1, step=1, pack=pack)
    assert out.updated and out.self_certainty == values
    assert torch.equal(out.advantages.advantages, adv.advantages)
    assert out.advantages.zero_signal.tolist() == adv.zero_signal.tolist() and any(adv.zero_signal.tolist())
    assert out.stats == stats
    (got,), (expected,) = ours.grads, today.grads
    assert got.keys() == expected.keys() and all(torch.equal(got[n], g) for n, g in expected.items())
    # Teeth: every group dropped (all four rows tie) leaves nothing to train: no backward, `updated` False.
    tied = StepRewards(((INVALID, INVALID), (INVALID, INVALID), (INVALID, INVALID)), target_types=(0, 0, 1))
    idle = TorchBackend(policy, cfg, reference)
    none = grpo_update_after_self_certainty(idle, batch, LOSS, tied, adv_cfg, action_only=False, rank=0,
                                            world_size=1, step=1, pack=pack)
    assert not none.updated and idle.grads == [] and none.stats.num_tokens == 0


@pytest.mark.parametrize("shared_prompt, pack, scale", [(False, False, "batch"), (True, False, "decoupled"),
                                                      (True, True, "group")])
def test_dropped_groups_known_before_s_give_todays_numbers(models, shared_prompt, pack, scale):
    """rl.self_certainty_breaks_ties=false: group 0 is dropped before any forward; its rows' no-grad micro-batch, then
    the kept rows' two with gradient give today's s(r) (group 0's moves the batch std), advantages and gradient."""
    policy, reference, _ = models
    batch, adv_cfg = _batch(), dataclasses.replace(NO_TIES, scale_rewards=scale)
    cfg = LearnerConfig(max_tokens_per_micro_batch=40, shared_prompt=shared_prompt, pack_sequences=pack)
    today, ours = TorchBackend(policy, cfg, reference), TorchBackend(policy, cfg, reference)
    assert len(micro_batches(ours, batch.select(range(2)), pack)) == 1
    assert len(micro_batches(ours, batch.select(range(2, 6)), pack)) == 2
    values, adv, stats = todays_path(today, batch, pack, SPLIT, adv_cfg)
    out = grpo_update_with_self_certainty(ours, batch, LOSS, SPLIT, adv_cfg, first_row=0, step=1, pack=pack)
    assert out.updated and out.self_certainty == pytest.approx(values, rel=1e-6, abs=1e-9)
    assert out.advantages.zero_signal.tolist() == adv.zero_signal.tolist() == [True, False, False]
    torch.testing.assert_close(out.advantages.advantages, adv.advantages, rtol=1e-6, atol=1e-9)
    if scale == "batch":  # group 0's s(r) is in the std (alpha * s against totals ~1000: a small move)
        moved = step_advantages(SPLIT.with_self_certainty([0.0, 0.0, *values[2:]], adv_cfg.reward), adv_cfg)
        assert float((moved.advantages - adv.advantages).abs().max()) > 1e-9
    assert out.stats.num_tokens == stats.num_tokens == 5 + 7 + 2 + 6
    for name in ("loss", "kl", "clip_fraction", "ratio_mean", "grad_norm", "sampler_logprob_abs_diff_mean",
                 "sampler_logprob_abs_diff_max", "is_weight_mean", "is_truncated_fraction"):
        assert getattr(out.stats, name) == pytest.approx(getattr(stats, name), rel=1e-5, abs=1e-9), name
    assert ours.calls == ["begin", "backward", "step"]
    (got,), (expected,) = ours.grads, today.grads
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("rewards, adv_cfg, dropped_with_grad", [(SPLIT, NO_TIES, False), (REWARDS, ADV, True)])
def test_the_known_dropped_rows_forward_without_gradient(models, rewards, adv_cfg, dropped_with_grad):
    """Each forward of the policy's transformer: which groups' rows it ran and whether its output carries a graph.
    With rl.self_certainty_breaks_ties=false the dropped group 0 runs alone, no graph built; the kept groups' rows run
    with gradient. Teeth: with it true (s(r) decides) group 0 runs with gradient, as before."""
    policy, reference, _ = models
    batch = _batch()
    prompts = {tuple(batch.input_ids[b, :5].tolist()): b // 2 for b in range(6)}
    seen = []

    def record(module, args, output):  # the embedding: the first module of the full forward and of the one that runs
        groups = {prompts[key] for key in map(tuple, args[0][:, :5].tolist()) if key in prompts}  # the last layer
        seen.append((groups, output.requires_grad))  # at the targets only

    handle = policy.model.embed_tokens.register_forward_hook(record)
    try:
        out = grpo_update_with_self_certainty(TorchBackend(policy, LearnerConfig(max_tokens_per_micro_batch=40),
                                                           reference), batch, LOSS, rewards, adv_cfg, 0, step=1)
    finally:
        handle.remove()
    assert out.updated and out.advantages.zero_signal.tolist() == [True, False, False]
    with_group_0 = [graph for groups, graph in seen if 0 in groups]
    assert with_group_0 == [dropped_with_grad]  # one micro-batch holds group 0's rows
    if not dropped_with_grad:
        assert [(groups, graph) for groups, graph in seen] == [({0}, False), ({1}, True), ({2}, True)]


def test_s_comes_from_the_unscaled_logits_and_the_dropped_rows_train_nothing(models):
    """Teeth: s(r) at the sampling temperature, or the dropped group trained, would move the numbers compared above."""
    policy, reference, _ = models
    batch, cfg = _batch(), LearnerConfig(max_tokens_per_micro_batch=40)
    ours = grpo_update_with_self_certainty(TorchBackend(policy, cfg, reference), batch, LOSS, REWARDS, ADV, 0, step=1)
    at_one = rationale_self_certainty(TorchBackend(policy, cfg), dataclasses.replace(batch, temperature=1.0), "p_to_u")
    assert ours.self_certainty == pytest.approx(at_one, rel=1e-6, abs=1e-9)
    kept_all = dataclasses.replace(ADV, drop_zero_signal_groups=False)
    every = grpo_update_with_self_certainty(TorchBackend(policy, cfg, reference), batch, LOSS, REWARDS, kept_all, 0,
                                            step=1)
    assert every.stats.num_tokens == ours.stats.num_tokens + 6 + 4  # group 0's completions (6 and 4 tokens)


def test_nothing_to_train_skips_the_update_but_returns_s(models):
    policy, reference, _ = models
    ties = StepRewards(((INVALID, INVALID), (INVALID, INVALID), (TYPE_ONLY, TYPE_ONLY)), target_types=(0, 0, 1))
    backend = TorchBackend(policy, LearnerConfig(max_tokens_per_micro_batch=40), reference)
    no_ties = dataclasses.replace(ADV, self_certainty_breaks_ties=False)  # group 2's s(r) may not break its tie
    out = grpo_update_with_self_certainty(backend, _batch(), LOSS, ties, no_ties, first_row=0, step=1)
    assert not out.updated and out.stats.nonfinite == "" and backend.calls == []  # no backward, no step
    assert out.advantages.zero_signal.tolist() == [True, True, True] and len(out.self_certainty) == 6
    assert out.self_certainty[5] > 0
    nan = StepRewards(((INVALID, INVALID), (HIT, HIT), (TYPE_ONLY, dataclasses.replace(HIT, total=float("nan")))),
                      target_types=(0, 0, 1))
    out = grpo_update_with_self_certainty(backend, _batch(), LOSS, nan, ADV, first_row=0, step=1)
    assert not out.updated and out.stats.nonfinite == "reward" and backend.calls == []


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend, zero_stage, split", [("deepspeed", 2, False), ("deepspeed", 3, False),
                                                       ("fsdp2", 0, False), ("deepspeed", 2, True),
                                                       ("deepspeed", 3, True), ("fsdp2", 0, True)])
def test_the_learner_updates_the_weights_as_today(models, tiny_model_dir, backend, zero_stage, split):
    """`split`: rl.self_certainty_breaks_ties=false, group 0 dropped before s(r): its rows' no-grad micro-batch, then
    the kept rows' two with gradient (under ZeRO-3 both kinds of forward gather the partitioned weights)."""
    from shop_r1.learner.rank import LearnerRank

    rewards, adv_cfg = (SPLIT, NO_TIES) if split else (REWARDS, ADV)
    _, _, ref_dir = models
    cfg = LearnerConfig(backend=backend, zero_stage=zero_stage, grad_clip=1e9, max_tokens_per_micro_batch=40)
    batch = _batch()
    today = LearnerRank(str(tiny_model_dir), cfg, lr=1e-3, total_steps=2, reference_path=str(ref_dir))
    before = dict(today.named_weights())
    values = today.rationale_self_certainty(batch, "p_to_u")
    adv = step_advantages(rewards.with_self_certainty(values, adv_cfg.reward), adv_cfg)
    stats = today.grpo_step(batch.with_advantages(adv.advantages).select(kept_rows(adv, adv_cfg)), LOSS)
    expected = dict(today.named_weights())
    ours = LearnerRank(str(tiny_model_dir), cfg, lr=1e-3, total_steps=2, reference_path=str(ref_dir))
    out = ours.grpo_step_with_self_certainty(batch, LOSS, rewards, adv_cfg, first_row=0)
    got = dict(ours.named_weights())
    assert out.updated and ours.step == today.step == 1
    assert out.self_certainty == pytest.approx(values, rel=1e-6, abs=1e-9)
    # The advantages are today's formula on the update's own s(r) (to rounding), and s(r) agrees within 1e-6 above;
    # compared with today's directly they would carry s(r)'s error amplified by (s1 + s2) / |s1 - s2| in group 1,
    # whose action rewards tie.
    own = step_advantages(rewards.with_self_certainty(out.self_certainty, adv_cfg.reward), adv_cfg)
    torch.testing.assert_close(out.advantages.advantages, own.advantages, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out.advantages.advantages, adv.advantages, rtol=1e-4, atol=1e-9)
    assert out.advantages.zero_signal.tolist() == [True, False, False]
    assert out.stats.num_tokens == stats.num_tokens
    assert out.stats.loss == pytest.approx(stats.loss, rel=1e-5, abs=1e-9)
    assert out.stats.grad_norm == pytest.approx(stats.grad_norm, rel=1e-5)
    # Adam's first step moves a weight by lr * g / (|g| + 1e-8): where |g| ~ 1e-8 the summation order of the two
    # splits (the selected rows, or every row with the dropped ones masked) shows, amplified by up to lr / 1e-8 per
    # unit of g's rounding: a rounding of ~1e-9 in g is up to 10% of lr (1.1e-5 measured on ZeRO-2 on a Xeon, 2.3e-5
    # on an AVX-512 EPYC). A lost micro-batch, a trained dropped group or another advantage flips signs: 2 x lr = 2e-3,
    # 20 times this bound.
    moved = max(float((expected[n] - before[n]).abs().max()) for n in before)
    diff = max(float((got[n] - expected[n]).abs().max()) for n in expected)
    assert moved > 9e-4 and diff < 1e-4, (moved, diff)


class _Exchange:
    """All-reduce between in-process ranks running in threads."""

    def __init__(self, n):
        self.barrier, self.slots = threading.Barrier(n), [None] * n

    def all_reduce(self, rank, values, op):
        self.slots[rank] = values.clone()
        self.barrier.wait()
        stacked = torch.stack(self.slots)
        out = stacked.sum(dim=0) if op == "sum" else stacked.max(dim=0).values
        self.barrier.wait()
        return out


class _Rank(TorchBackend):
    def __init__(self, model, cfg, reference, rank, exchange):
        super().__init__(model, cfg, reference)
        self.rank, self.world_size, self.exchange = rank, 2, exchange

    def all_reduce(self, values, op="sum"):
        return self.exchange.all_reduce(self.rank, values, op)


@pytest.mark.parametrize("split, known", [(3, False), (2, False), (3, True), (2, True)])
def test_two_ranks_place_their_s_and_train_the_whole_batchs_gradient(models, split, known):
    """Rows 0-2 on rank 0 and 3-5 on rank 1 (group 1 split between them, as LearnerGroup._shares splits), or rank 0
    holding only the dropped group 0 (its backward joins with a loss of 0): every rank holds every response's s(r)
    and the same advantages, and the ranks' gradients sum to the one rank's. `known`: rl.self_certainty_breaks_ties=
    false, group 0 dropped before s(r) (a rank without dropped or kept rows runs empty micro-batches of that kind)."""
    policy, reference, _ = models
    rewards, adv_cfg = (SPLIT, NO_TIES) if known else (REWARDS, ADV)
    batch, cfg = _batch(), LearnerConfig(max_tokens_per_micro_batch=40)
    one = TorchBackend(policy, cfg, reference)
    whole = grpo_update_with_self_certainty(one, batch, LOSS, rewards, adv_cfg, first_row=0, step=1)
    exchange, outs = _Exchange(2), [None, None]
    ranks = [_Rank(copy.deepcopy(policy), cfg, reference, r, exchange) for r in range(2)]

    def run(r):
        rows = range(split) if r == 0 else range(split, 6)
        outs[r] = grpo_update_with_self_certainty(ranks[r], batch.select(rows), LOSS, rewards, adv_cfg,
                                                  first_row=rows[0], step=1)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for out in outs:
        assert out.updated and out.self_certainty == pytest.approx(whole.self_certainty, rel=1e-6, abs=1e-9)
        # Where a group's action rewards tie, its advantages are its s(r) differences over their std: a rank's packs
        # (group 1 split between ranks attends over fewer keys) change s(r) in the 7th digit, which that division
        # magnifies to ~1e-5 relative. A misplaced s(r) moves an advantage by O(1).
        torch.testing.assert_close(out.advantages.advantages, whole.advantages.advantages, rtol=1e-4, atol=1e-6)
        assert out.stats.num_tokens == whole.stats.num_tokens
        assert out.stats.loss == pytest.approx(whole.stats.loss, rel=1e-5)  # (TorchBackend: the rank's own norm)
    (expected,) = one.grads
    assert ranks[0].calls == ranks[1].calls == ["begin", "backward", "step"]
    for name, grad in expected.items():
        torch.testing.assert_close(ranks[0].grads[0].get(name, 0) + ranks[1].grads[0][name], grad, rtol=1e-4, atol=1e-7,
                                   msg=name)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend, zero_stage, known", [("deepspeed", 3, False), ("fsdp2", 0, False),
                                                       ("deepspeed", 3, True), ("fsdp2", 0, True)])
def test_a_skipped_step_leaves_the_learner_as_it_was_and_the_next_one_trains(models, tiny_model_dir, backend,
                                                                             zero_stage, known):
    """Forwards with gradient and no backward (nothing to train), or, `known` (rl.self_certainty_breaks_ties=false:
    every group dropped before s(r)), no-grad forwards only: under ZeRO-3 and FSDP2 the next step still runs and
    trains exactly as a fresh learner's first step."""
    from shop_r1.learner.rank import LearnerRank

    _, _, ref_dir = models
    cfg = LearnerConfig(backend=backend, zero_stage=zero_stage, grad_clip=1e9, max_tokens_per_micro_batch=40)
    ties = StepRewards(((INVALID, INVALID), (INVALID, INVALID), (INVALID, INVALID)), target_types=(0, 0, 1))
    skipped = LearnerRank(str(tiny_model_dir), cfg, lr=1e-3, total_steps=2, reference_path=str(ref_dir))
    before = dict(skipped.named_weights())
    out = skipped.grpo_step_with_self_certainty(_batch(), LOSS, ties, NO_TIES if known else ADV, first_row=0)
    assert not out.updated and skipped.step == 0 and out.stats.nonfinite == ""
    after_skip = dict(skipped.named_weights())
    assert all(torch.equal(after_skip[n], before[n]) for n in before)
    trained = skipped.grpo_step_with_self_certainty(_batch(), LOSS, REWARDS, ADV, first_row=0)
    fresh = LearnerRank(str(tiny_model_dir), cfg, lr=1e-3, total_steps=2, reference_path=str(ref_dir))
    expected = fresh.grpo_step_with_self_certainty(_batch(), LOSS, REWARDS, ADV, first_row=0)
    assert trained.updated and skipped.step == 1
    assert trained.stats.loss == pytest.approx(expected.stats.loss, rel=1e-6)
    assert trained.stats.grad_norm == pytest.approx(expected.stats.grad_norm, rel=1e-6)
    got, want = dict(skipped.named_weights()), dict(fresh.named_weights())
    assert max(float((got[n] - want[n]).abs().max()) for n in want) < 2e-5


@pytest.mark.timeout(600)
def test_the_learner_group_sends_the_whole_batch_and_every_response_s_rewards(models, tiny_model_dir):
    """The group the driver calls (local mode: one in-process rank), its arguments through pickle as Ray sends them;
    and the rows each of K ranks gets start where its share starts."""
    from shop_r1.distributed.learner_group import LearnerGroup

    _, _, ref_dir = models
    cfg = LearnerConfig(grad_clip=1e9, max_tokens_per_micro_batch=40)
    group = LearnerGroup(str(tiny_model_dir), cfg, lr=1e-3, total_steps=2, seed=0, local=True,
                         reference_path=str(ref_dir))
    try:
        values = group.rationale_self_certainty(_batch(), "p_to_u")
        (out,) = group.grpo_step_with_self_certainty(*pickle.loads(pickle.dumps((_batch(), LOSS, REWARDS, ADV))))
    finally:
        group.shutdown()
    assert out.updated and out.self_certainty == pytest.approx(values, rel=1e-6, abs=1e-9)
    assert out.advantages.zero_signal.tolist() == [True, False, False]
    group.world_size = 4
    shares, firsts = group._shares(_batch()), group._bounds(6)[:-1]
    assert firsts == [0, 1, 3, 4] and [s.num_responses for s in shares] == [1, 2, 1, 2]
    assert all(torch.equal(s.input_ids, _batch().select(range(f, f + s.num_responses)).input_ids)
               for s, f in zip(shares, firsts))
