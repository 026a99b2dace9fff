"""rl: the GRPO stage (steps, learning rate, loss, advantages, checkpoints, one-step-off, validation), the cuts of it
that the advantages and the learner read (`AdvantageConfig`, `LossConfig`), and its rules (`problems`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from shop_r1.config.fields import bounded
from shop_r1.config.reward import RewardConfig
from shop_r1.config.rollout import RolloutConfig

LossVariant = Literal["dapo", "grpo", "dr_grpo", "gspo"]
"""rl.loss: how the per-token GRPO loss is aggregated (and, for gspo, where the importance ratio is taken)."""


@dataclass
class RLConfig:
    steps: int = bounded(500, ge=1)
    """GRPO steps (one rollout batch each)."""
    lr: float = bounded(1e-7, gt=0)
    """Learning rate (constant after rl.warmup_steps)."""
    warmup_steps: int = bounded(0, ge=0)
    """GRPO steps over which the learning rate rises linearly from 0 to rl.lr (0: none, the paper's). Adam's first
    steps move every weight by about the learning rate whatever its gradient's size; a warm-up damps them."""
    global_batch_size: int = bounded(64, ge=1)
    """Prompts x group samples per rollout batch, as in the paper (per-device batch 1 on 64 ranks); a multiple of
    rollout.group_size."""
    kl_beta: float = bounded(0.001, ge=0)
    """Weight of KL(pi || pi_ref), Eq. 4 (k3 estimator, in the loss)."""
    clip_eps: float = bounded(0.2, gt=0, lt=1)
    """PPO clip range below 1 (and above, unless clip_eps_high is set)."""
    clip_eps_high: float = bounded(0.0, ge=0, lt=1)
    """Separate upper clip (clip-higher); 0 means the same as clip_eps."""
    loss: LossVariant = "dapo"
    """How each token's clipped surrogate + kl_beta * KL becomes the step's loss (shop_r1/algo/grpo_loss.py), over
    the B responses of the global batch, N tokens in all, |o_i| in response i:
    `dapo` (default, what the measured results ran): sum_{i,t} / N, a global token mean (long answers weigh more).
    `grpo`: 1/B sum_i 1/|o_i| sum_t, the paper's per-sequence mean (every response weighs the same).
    `dr_grpo`: sum_{i,t} / (B x rollout.max_new_tokens), a constant normaliser (Dr. GRPO; with scale_rewards=none).
    `gspo`: one ratio per response, exp(mean_t log pi/pi_old), clipped as a whole, then as `grpo` (GSPO)."""
    num_minibatches: int = bounded(1, ge=1)
    """Optimizer steps per rollout batch (the batch is split into this many mini-batches)."""
    loss_tokens: Literal["completion", "action"] = "completion"
    """Which completion tokens the policy-gradient and KL terms train. `completion` (the paper): every one.
    `action`: those outside the rationale (the action's JSON and the scaffolding around the rationale), so the
    advantage of an answer moves its action given the rationale it sampled, not the rationale's wording (the rationale
    is still sampled, conditions the action and gives s(r)). A response without a parseable rationale (invalid JSON)
    trains every token, as under `completion`. Not with reward.self_certainty.source=update_logits."""
    drop_zero_signal_groups: bool = False
    """Leave out zero-signal groups (their advantages are 0 anyway): see self_certainty_breaks_ties."""
    scale_rewards: Literal["group", "batch", "none", "target_type", "decoupled", "within_type"] = "group"
    """Advantage normalisation, A = (r - group mean) / scale: `group` divides by the group's std (GRPO, the paper),
    `batch` by the std of all rewards of the step's batch, `none` by nothing (Dr. GRPO; advantages are then in reward
    units, up to ~DARS = 1000 for a click, so rl.lr must be far smaller), `target_type` by the std of the rewards of
    the step's groups whose target has the same action type (batch std per type: a right `terminate` earns 0.3 next
    to DARS-scale clicks and queries, so one batch std leaves terminate groups without signal; shop_r1/algo/
    advantages.py), `decoupled` normalises the decision (format + action_type) and the content (attribute + value +
    alpha * s) each by its own group std, sums them and divides by the sum's batch std (GDPO); `within_type` scales
    the decision by its batch std and compares the content only among the group's answers of the right action type,
    so a type whose near-misses pay more (queries' partial ROUGE credit) does not win the type prior; alpha * s(r)
    then counts only among right-type answers (a group whose answers are all of the wrong type gets advantages 0
    even where self-certainty breaks ties). Needs the hierarchical Shop-R1 reward (refused with reward.fn or
    action_reward=binary)."""
    self_certainty_breaks_ties: bool = True
    """True (the paper): a group is zero-signal only when its *total* rewards all tie, so alpha * s(r), which always
    differs a little, decides the advantages of a group whose samples earn the same action reward (|A| up to ~2.5
    after group-std scaling). False: a group whose format + action_type + attribute + value all tie is zero-signal
    (advantages 0; dropped with drop_zero_signal_groups); other groups still use the total, self-certainty included.
    A plug-in `reward.fn` must then fill those four terms, not only `total`, or every group ties. With
    reward.self_certainty.source=update_logits, false also lets the learner know the dropped groups before s(r) and
    forward their rows without gradient (cheaper than learner_logits; see there)."""
    checkpoint_every: int = bounded(10, ge=1)
    """Save a resumable checkpoint every this many steps (and at the end): what a crash that no restart covers can
    cost. Measured (benchmarks/bench_checkpoint.py, 2-core CPU): SmolLM2-135M's checkpoint (1.6 GB with AdamW
    state) takes 3.4 s against a 40.6 s GRPO step, so every 10 steps costs 0.8% of the run and risks at most ~7
    minutes; every 50 would risk 34."""
    max_restarts: int = bounded(2, ge=0)
    """A learner rank (or any actor the loop cannot replace) that dies ends the attempt: the driver tears the actors
    down and resumes from the last complete checkpoint in the same process, at most this many times."""
    max_nonfinite_steps: int = bounded(3, ge=1)
    """A step whose rewards, advantages, loss or gradient norm is NaN/inf skips its update (counted by cause in
    train/nonfinite_*); this many such steps in a row stop the run with an error, its checkpoints holding finite
    weights only (shop_r1/algo/finite.py)."""
    keep_checkpoints: int = bounded(2, ge=1)
    """Keep the newest this many complete checkpoints; older ones are removed after a newer one is complete."""
    weight_sync_bucket_mb: int = bounded(256, ge=1)
    """Size bound of one broadcast bucket during weight sync; the first bucket is bounded by an eighth of it, so the
    engines start loading while the larger rest is on the wire (shop_r1/weight_sync/broadcast.py first_bucket_bytes)."""
    check_weight_sync: bool = False
    """Debug: after every sync, compare the engines' logprobs with the learner's on a probe batch."""
    async_level: int = bounded(0, ge=0, le=1)
    """0: synchronous (generate, then update, then sync). 1: one-step-off: the rollout of step t+1 is generated while
    step t's update runs, by the weights of step t-1 (every sample's policy lag, recorded per sample, is at most 1);
    the loss then corrects for the stale sampler with a capped importance weight."""
    async_is_cap: float = bounded(2.0, ge=1)
    """With async_level=1: the per-token importance weight pi_learner / pi_sampler (both at the sampling
    temperature, before the update) on the surrogate is truncated at this value (truncated importance sampling, as
    TRL's vLLM importance-sampling correction)."""
    val_every: int = bounded(0, ge=0)
    """Every this many GRPO steps (and at the last, and as step 0 before the first update unless resuming) the
    engines, holding the step's weights, answer the first val_examples validation prompts greedily (up to
    rollout.max_new_tokens); `val/*` (exact, kappa, predicted-type mix) are logged with the step. Needs run_grpo's
    `val_prompts`. 0: off."""
    val_examples: int = bounded(64, ge=1)
    """Validation prompts scored each time (the first this many, a fixed subset)."""

    def advantage_config(self, reward: RewardConfig) -> AdvantageConfig:
        """The advantages' cut of the config (with the reward section, which re-forms the totals with s(r))."""
        return AdvantageConfig(scale_rewards=self.scale_rewards,
                               self_certainty_breaks_ties=self.self_certainty_breaks_ties,
                               drop_zero_signal_groups=self.drop_zero_signal_groups, reward=reward)

    def loss_config(self, max_new_tokens: int) -> LossConfig:
        """The learner's cut of the config (rollout.max_new_tokens is dr_grpo's normaliser)."""
        return LossConfig(loss=self.loss, clip_eps_low=self.clip_eps,
                          clip_eps_high=self.clip_eps_high or self.clip_eps, kl_beta=self.kl_beta,
                          num_minibatches=self.num_minibatches,
                          async_is_cap=self.async_is_cap if self.async_level else None, max_new_tokens=max_new_tokens)


@dataclass(frozen=True)
class AdvantageConfig:
    """What a step's advantages read (shop_r1/algo/step_rewards.py), cut from the config by
    `RLConfig.advantage_config`: the driver computes them with it, and so does the learner where s(r) comes from the
    update's own forward (reward.self_certainty.source=update_logits)."""

    scale_rewards: Literal["group", "batch", "none", "target_type", "decoupled", "within_type"]
    """rl.scale_rewards."""
    self_certainty_breaks_ties: bool
    """rl.self_certainty_breaks_ties."""
    drop_zero_signal_groups: bool
    """rl.drop_zero_signal_groups."""
    reward: RewardConfig
    """The reward section: alpha and rationale_reward re-form the totals with s(r), self_certainty says how s(r) is
    computed."""


@dataclass(frozen=True)
class LossConfig:
    """What the GRPO update reads (shop_r1/learner/grpo_step.py), cut from RLConfig by `RLConfig.loss_config`: the
    learner gets this, not the run's checkpoint, sync or validation settings."""

    loss: LossVariant
    """rl.loss."""
    clip_eps_low: float
    """rl.clip_eps."""
    clip_eps_high: float
    """rl.clip_eps_high, or rl.clip_eps when that is 0."""
    kl_beta: float
    """rl.kl_beta."""
    num_minibatches: int
    """rl.num_minibatches: optimizer steps per rollout batch."""
    async_is_cap: float | None
    """rl.async_is_cap with one-step-off rollouts (rl.async_level=1); None: synchronous, no importance weight."""
    max_new_tokens: int
    """rollout.max_new_tokens: the constant per-response length dr_grpo divides by."""


class _Sections(Protocol):
    """What the rl rules read of the root Config (which imports this module)."""

    rl: RLConfig
    reward: RewardConfig
    rollout: RolloutConfig


def problems(cfg: _Sections, bad: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The rl section's cross-field rules, one line each (`bad`: keys out of their range, whose rules are left
    out: no modulo by a bad group size)."""
    out = []
    batch, group = cfg.rl.global_batch_size, cfg.rollout.group_size
    if not bad & {"rl.global_batch_size", "rollout.group_size"} and batch % group:
        out.append(f"rl.global_batch_size={batch} is not a multiple of rollout.group_size={group}: a rollout batch is "
                   f"P prompts x G samples (e.g. rl.global_batch_size={max(1, batch // group) * group})")
    if cfg.rl.scale_rewards == "within_type" and (cfg.reward.fn or cfg.reward.action_reward == "binary"):
        what = f"reward.fn={cfg.reward.fn!r}" if cfg.reward.fn else "reward.action_reward=binary"
        out.append(f"rl.scale_rewards=within_type needs Table 1's hierarchical reward (got {what}): it reads the "
                   "right action type from the action-type reward, which a plug-in reward need not fill and the "
                   "binary reward pays only for an exact match; use rl.scale_rewards=batch or group")
    source = cfg.reward.self_certainty.source  # was the reward section's rule: it reads rl.num_minibatches
    if source == "update_logits" and cfg.rl.num_minibatches != 1 and "rl.num_minibatches" not in bad:
        out.append(f"reward.self_certainty.source=update_logits needs rl.num_minibatches=1 (got "
                   f"{cfg.rl.num_minibatches}): s(r) comes from the update's own forward, and a later "
                   "mini-batch's forward follows an optimizer step; use "
                   "reward.self_certainty.source=learner_logits")
    if cfg.rl.loss_tokens == "action" and cfg.reward.self_certainty.source == "update_logits":  # was train.py's
        out.append("rl.loss_tokens=action does not combine with reward.self_certainty.source=update_logits (its "
                   "forward reads the rationale's tokens from the loss mask): use learner_logits")
    return out
