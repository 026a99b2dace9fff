"""rl.loss: the four aggregations of the GRPO loss, each by hand on three tokens and against the reference formula of
TRL's GRPOTrainer documentation (loss_type="grpo" / "dapo" / "dr_grpo", importance_sampling_level="sequence"), the
latter also when the batch is split into micro-batches weighted by their share of the global units (as the learner's
step does); and the config switch itself."""

import math

import pytest
import torch

from shop_r1.algo.advantages import group_advantages
from shop_r1.algo.grpo_loss import LossInputs, grpo_loss, loss_units
from shop_r1.config import ConfigError, RLConfig, load_config

LN2 = math.log(2.0)


def _cfg(loss, kl_beta=0.0, eps_low=0.2, eps_high=0.2, max_new_tokens=4):
    return RLConfig(loss=loss, kl_beta=kl_beta, clip_eps=eps_low, clip_eps_high=eps_high).loss_config(max_new_tokens)


# Two responses: o_1 has 2 tokens (A_1 = 1), o_2 has 1 token (A_2 = -0.5); padding at the end of each row.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
ADV = torch.tensor([1.0, -0.5])


def _on_policy(loss):
    """ratio 1 everywhere: loss_t = -A_i (no KL). Returns the loss and its gradient with respect to logp."""
    logp = torch.zeros(2, 3, requires_grad=True)
    out = grpo_loss(LossInputs(logp, logp.detach(), ADV, MASK), _cfg(loss))
    (grad,) = torch.autograd.grad(out.loss, logp)
    return float(out.loss.detach()), grad * MASK


def _close(got, expected):
    torch.testing.assert_close(got, torch.tensor(expected, dtype=got.dtype), rtol=1e-6, atol=1e-7)


def test_dapo_by_hand():
    # loss_t = -1, -1 (o_1) and +0.5 (o_2): sum -1.5 over N = 3 tokens -> -0.5; each token's gradient -A_i / 3.
    loss, grad = _on_policy("dapo")
    assert loss == pytest.approx(-0.5)
    _close(grad, [[-1 / 3, -1 / 3, 0.0], [0.5 / 3, 0.0, 0.0]])


def test_grpo_by_hand():
    # Per response: mean(-1, -1) = -1 and 0.5; over B = 2 responses: (-1 + 0.5) / 2 = -0.25.
    # Gradient: -A_i / (|o_i| B): o_1's tokens -1 / 4, o_2's +0.5 / 2 (a short answer's token weighs more).
    loss, grad = _on_policy("grpo")
    assert loss == pytest.approx(-0.25)
    _close(grad, [[-0.25, -0.25, 0.0], [0.25, 0.0, 0.0]])


def test_dr_grpo_by_hand():
    # Token sum -1.5 over the constant B x L = 2 x 4 = 8: -0.1875; each token's gradient -A_i / 8.
    loss, grad = _on_policy("dr_grpo")
    assert loss == pytest.approx(-0.1875)
    _close(grad, [[-0.125, -0.125, 0.0], [0.0625, 0.0, 0.0]])


def test_gspo_by_hand_against_the_token_ratio():
    # o_1's token ratios are 2 and 0.5 (log ratios ln 2, -ln 2), o_2's is 1.5; clip at 1 +- 0.2.
    old = torch.zeros(2, 3)
    logp = torch.tensor([[LN2, -LN2, 0.0], [math.log(1.5), 0.0, 0.0]], requires_grad=True)
    token = grpo_loss(LossInputs(logp, old, ADV, MASK), _cfg("grpo"))
    sequence = grpo_loss(LossInputs(logp, old, ADV, MASK), _cfg("gspo"))
    # grpo (token ratios): o_1: min(2, 1.2) = 1.2 and min(0.5, 0.8) = 0.5 -> mean -0.85; o_2 (A < 0): min(-0.75,
    # -0.6) = -0.75 -> +0.75; (-0.85 + 0.75) / 2 = -0.05, and one token of three clipped.
    assert float(token.loss.detach()) == pytest.approx(-0.05) and token.clip_fraction == pytest.approx(1 / 3)
    # gspo: o_1's ratio is exp(mean(ln 2, -ln 2)) = 1, unclipped: -1 on both tokens; o_2's is 1.5 as before:
    # (-1 + 0.75) / 2 = -0.125, nothing clipped; ratio mean over tokens (1 + 1 + 1.5) / 3.
    assert float(sequence.loss.detach()) == pytest.approx(-0.125) and sequence.clip_fraction == 0.0
    assert sequence.ratio_mean == pytest.approx(3.5 / 3)
    # Gradient: -A_i s_i / (|o_i| B) per token (d s_i / d logp_t = s_i / |o_i|): o_1: -1 x 1 / (2 x 2) = -0.25 each;
    # o_2: 0.5 x 1.5 / 2 = 0.375. The token ratio gives o_1's clipped token no gradient at all.
    (grad,) = torch.autograd.grad(sequence.loss, logp)
    _close(grad * MASK, [[-0.25, -0.25, 0.0], [0.375, 0.0, 0.0]])
    (grad,) = torch.autograd.grad(token.loss, logp)
    _close(grad * MASK, [[0.0, -0.125, 0.0], [0.375, 0.0, 0.0]])


def _trl_reference(logp, old, ref, adv, mask, loss, beta, eps_low, eps_high, max_completion_length):
    """TRL's GRPOTrainer documentation, written out per response i and token t (float64, plain loops):
        l_{i,t} = -min(rho_{i,t} A_i, clip(rho_{i,t}, 1 - eps_low, 1 + eps_high) A_i) + beta D_KL_{i,t}
        D_KL_{i,t} = exp(ref - logp) - (ref - logp) - 1
        rho_{i,t} = exp(logp_{i,t} - old_{i,t});  importance_sampling_level="sequence" (GSPO):
        rho_i = exp(1/|o_i| sum_t (logp_{i,t} - old_{i,t}))
        loss_type="grpo":    1/G sum_i 1/|o_i| sum_t l_{i,t}
        loss_type="dapo":    sum_i sum_t l_{i,t} / sum_i |o_i|
        loss_type="dr_grpo": sum_i sum_t l_{i,t} / (G * max_completion_length)
    GSPO is importance_sampling_level="sequence" with loss_type="grpo" (TRL's paper index)."""
    G = logp.shape[0]
    per_response, total, n_tokens = [], 0.0, 0
    for i in range(G):
        tokens = [t for t in range(logp.shape[1]) if mask[i, t]]
        seq_rho = math.exp(sum(float(logp[i, t] - old[i, t]) for t in tokens) / len(tokens))
        values = []
        for t in tokens:
            rho = seq_rho if loss == "gspo" else math.exp(float(logp[i, t] - old[i, t]))
            a = float(adv[i])
            d = float(ref[i, t] - logp[i, t])
            values.append(-min(rho * a, min(max(rho, 1 - eps_low), 1 + eps_high) * a) + beta * (math.exp(d) - d - 1))
        per_response.append(sum(values) / len(tokens))
        total += sum(values)
        n_tokens += len(tokens)
    if loss in ("grpo", "gspo"):
        return sum(per_response) / G
    if loss == "dapo":
        return total / n_tokens
    return total / (G * max_completion_length)


@pytest.mark.parametrize("loss", ["dapo", "grpo", "dr_grpo", "gspo"])
@pytest.mark.parametrize("split", [[[0, 1, 2, 3, 4]], [[0, 1], [2], [3, 4]]])
def test_each_variant_equals_trls_documented_formula_however_the_batch_is_split(loss, split):
    """Off-policy ratios (both clip sides hit), a KL term, responses of 1 to 6 tokens. A split batch: each
    micro-batch's loss weighted by its `loss_units` over the batch's, as shop_r1/learner/grpo_step.py does."""
    g = torch.Generator().manual_seed(7)
    lengths = [3, 1, 6, 2, 5]
    mask = torch.zeros(5, 6)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    logp = -torch.rand(5, 6, generator=g, dtype=torch.float64) * 2
    old = logp + torch.randn(5, 6, generator=g, dtype=torch.float64) * 0.3
    ref = logp + torch.randn(5, 6, generator=g, dtype=torch.float64) * 0.2
    adv = torch.randn(5, generator=g, dtype=torch.float64)
    cfg = _cfg(loss, kl_beta=0.04, eps_low=0.2, eps_high=0.28, max_new_tokens=8)
    expected = _trl_reference(logp, old, ref, adv, mask, loss, 0.04, 0.2, 0.28, 8)
    total_units = loss_units(mask, loss)
    got = 0.0
    for rows in split:
        r = torch.tensor(rows)
        out = grpo_loss(LossInputs(logp[r], old[r], adv[r], mask[r], ref_logp=ref[r]), cfg)
        got += float(out.loss) * loss_units(mask[r], loss) / total_units
    assert got == pytest.approx(expected, rel=1e-12)


def test_dr_grpo_composes_with_unscaled_advantages():
    """rl.scale_rewards acts before the loss: Dr. GRPO's full recipe (no std scaling, constant normaliser) is two
    switches, and the loss sees the advantages as they come: rewards (1, 3) -> A = (-1, 1), unscaled."""
    cfg = load_config(None, ["rl.loss=dr_grpo", "rl.scale_rewards=none", "rollout.max_new_tokens=4"])
    adv = group_advantages(torch.tensor([[1.0, 3.0]], dtype=torch.float64), scale=cfg.rl.scale_rewards).advantages
    assert adv.tolist() == [[-1.0, 1.0]]
    logp = torch.zeros(2, 3)
    out = grpo_loss(LossInputs(logp, logp, adv[0], MASK), cfg.rl.loss_config(cfg.rollout.max_new_tokens))
    # loss_t = -A_i: +1, +1 (o_1), -1 (o_2): sum 1 over B x L = 2 x 4 = 8.
    assert float(out.loss) == pytest.approx(1 / 8)


def test_the_switch_loads_each_variant_and_refuses_others_naming_the_key():
    assert load_config().rl.loss == "dapo"  # the measured results' loss (today's global token mean) stays default
    for variant in ("grpo", "dapo", "dr_grpo", "gspo"):
        cfg = load_config(None, [f"rl.loss={variant}", "rollout.max_new_tokens=64"])
        assert cfg.rl.loss_config(cfg.rollout.max_new_tokens).loss == variant
    with pytest.raises(ConfigError, match=r"rl\.loss: expected one of \('dapo', 'grpo', 'dr_grpo', 'gspo'\)"):
        load_config(None, ["rl.loss=nope"])
    with pytest.raises(ConfigError, match=r"rl\.loss_aggregation: replaced by rl\.loss \(rl\.loss_aggregation=token "
                                          r"is rl\.loss=dapo, rl\.loss_aggregation=sequence is rl\.loss=grpo\)"):
        load_config(None, ["rl.loss_aggregation=token"])


def test_the_learners_cut_of_the_config():
    rl = RLConfig(loss="gspo", clip_eps=0.2, clip_eps_high=0.0, kl_beta=0.01, num_minibatches=2, async_level=1,
                  async_is_cap=3.0)
    cut = rl.loss_config(max_new_tokens=96)
    assert (cut.loss, cut.clip_eps_low, cut.clip_eps_high, cut.kl_beta) == ("gspo", 0.2, 0.2, 0.01)
    assert (cut.num_minibatches, cut.async_is_cap, cut.max_new_tokens) == (2, 3.0, 96)
    assert RLConfig(async_is_cap=3.0).loss_config(96).async_is_cap is None  # synchronous: no importance weight
