"""`shop-r1 train`: GRPO with the Shop-R1 hybrid reward (paper Eq. 4), as a Ray actor/learner loop.

    prompts -> engines generate G samples each -> reward pool scores them -> group advantages
            -> learner update (clipped surrogate + beta * KL to the frozen SFT policy) -> weight sync
            -> (every rl.val_every steps: greedy answers to a fixed validation subset) -> log -> ckpt

Backends and placement are chosen once, before the loop. `rl.global_batch_size` counts responses (P x G).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shop_r1 import checkpoint
from shop_r1.algo import finite, step_rewards
from shop_r1.algo.advantages import GroupAdvantages
from shop_r1.algo.batch import GRPOBatch, build_grpo_batch
from shop_r1.algo.step_rewards import StepRewards, update_rows
from shop_r1.config import Config, config_to_dict
from shop_r1.config import validate as check_config
from shop_r1.data.sampler import Cursor, PromptSampler
from shop_r1.distributed.engine_group import EngineFailure, EngineGroup
from shop_r1.distributed.learner_group import LearnerGroup
from shop_r1.distributed.protocols import Engines, Learners, WeightSync
from shop_r1.distributed.reward_pool import RewardPool
from shop_r1.distributed.rollouts import RolloutStream, StepRollout, load_pending
from shop_r1.distributed.sync_group import weight_sync_from_config
from shop_r1.reward.functions import RewardFunction, RewardTerm, reward_function_problems, terms_of
from shop_r1.reward.scorer import score_response
from shop_r1.reward.worker import ScoreFn, load_score_fn
from shop_r1.rollout.metrics import rollout_metrics, validation_metrics
from shop_r1.rollout.records import PolicyVersionMismatch, check_policy_versions, rollout_records
from shop_r1.storage import mirror_or_warn
from shop_r1.tracking import Tracker
from shop_r1.types import GRPOStepStats, Prompt, RewardBreakdown, SamplingSpec, ScoredGeneration, step_sampling_seed

PENDING_ROLLOUT = "pending_rollout.json"
SKIPPED = GRPOStepStats(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_mean=1.0, grad_norm=0.0, num_tokens=0, step=0)


@dataclass(frozen=True)
class GRPOResult:
    hf_dir: str
    num_steps: int
    first_reward: float
    last_reward: float
    seconds: float


def with_step_rewards(scored: list[ScoredGeneration], rewards: StepRewards) -> list[ScoredGeneration]:
    """The scored groups with `rewards` (the same responses, totals as the owner formed them,
    step_rewards.totals_and_advantages), each keeping what the reward stage parsed."""
    return [dataclasses.replace(s, rewards=tuple(dataclasses.replace(new, parsed=old.parsed)
                                                 for old, new in zip(s.rewards, group, strict=True)))
            for s, group in zip(scored, rewards.rewards, strict=True)]


def with_learner_self_certainty(scored: list[ScoredGeneration], certainty: list[float], cfg: Config
                                ) -> list[ScoredGeneration]:
    """certainty[i] (one per response, in batch order) replaces the i-th response's s(r); totals re-formed."""
    return with_step_rewards(scored, StepRewards.of(scored).with_self_certainty(certainty, cfg.reward))


def _rewards(scored: list[ScoredGeneration]) -> torch.Tensor:
    return torch.tensor([[r.total for r in s.rewards] for s in scored], dtype=torch.float64)  # [P, G]


def step_advantages(scored: list[ScoredGeneration], cfg: Config) -> GroupAdvantages:
    """Group advantages of the totals, scaled as rl.scale_rewards says; a group is zero-signal when its totals tie,
    or, with rl.self_certainty_breaks_ties=false, when its action rewards (the total without alpha * s) tie
    (shop_r1/algo/step_rewards.py: totals_and_advantages, which the learner also runs under
    reward.self_certainty.source=update_logits)."""
    return step_rewards.totals_and_advantages(StepRewards.of(scored), cfg.rl.advantage_config(cfg.reward)).advantages


def check_weight_sync(engines: Engines, learners: Learners, probe: Prompt, step: int, pad_id: int
                      ) -> dict[str, float]:
    """Debug mode: the engines' logprobs on a greedy probe must equal the learner's; versions must equal the step."""
    versions = engines.policy_versions()
    if versions != [step] * len(versions):
        raise RuntimeError(f"weight sync: engines report policy versions {versions} after pushing step {step}")
    gen = engines.generate([probe.token_ids], SamplingSpec(n=1, temperature=0.0, max_new_tokens=16,
                                                           top_k_logprobs=0))[0]
    scored = ScoredGeneration(probe, gen, tuple(RewardBreakdown() for _ in gen.completions))
    batch = build_grpo_batch([scored], torch.zeros(1, len(gen.completions), dtype=torch.float64), pad_id)
    ours = learners.probe_logprobs(batch)[0]
    theirs = gen.completions[0].logprobs
    diff = max((abs(a - b) for a, b in zip(ours, theirs)), default=0.0)
    return {"weight_sync/check_max_abs_logprob_diff": diff}


def learner_self_certainty_applies(cfg: Config, score_fn: ScoreFn) -> bool:
    """The learner's exact s(r) re-forms the totals only of the Shop-R1 hybrid reward (reward.fn empty, the default),
    with reward.self_certainty.source=learner_logits: a plug-in reward's total is its own, never altered here."""
    return score_fn is score_response and cfg.reward.self_certainty.source == "learner_logits"


def update_self_certainty_applies(cfg: Config, score_fn: ScoreFn) -> bool:
    """reward.self_certainty.source=update_logits with the Shop-R1 hybrid reward: the update's own forward gives s(r)
    and the learner the advantages (`update_from_own_logits`). A plug-in score function given in code (shop_r1/config/
    reward.py refuses update_logits with reward.fn) trains as under learner_logits: its totals are its own."""
    return score_fn is score_response and cfg.reward.self_certainty.source == "update_logits"


def update_batch(batch: GRPOBatch, adv: GroupAdvantages, cfg: Config) -> GRPOBatch:
    """The learner's batch: every response with its advantage, minus the groups without signal when
    `rl.drop_zero_signal_groups` (tied rewards: zero advantages, nothing to learn); with rl.loss_tokens=action only
    the completion tokens outside the rationale train (grpo_step.update_rows, the learner's one-call update's too)."""
    return update_rows(batch, adv, cfg.rl.advantage_config(cfg.reward), cfg.rl.loss_tokens == "action")


@dataclass(frozen=True)
class PreparedUpdate:
    scored: list[ScoredGeneration]  # with the learner's exact s(r) where it applies
    adv: GroupAdvantages | None  # None: the update computes s(r) and the advantages (reward.self_certainty.source)
    batch: GRPOBatch  # the step's one batch, advantages filled in (with adv None: every group, advantages 0)


def prepare_update(scored: list[ScoredGeneration], learners: Learners, cfg: Config, pad_id: int,
                   score_fn: ScoreFn) -> PreparedUpdate:
    """One batch per step, built once from the rollout, and one learner call for it. Where the learner's exact s(r)
    applies (reward.self_certainty.source=learner_logits or update_logits, with the Shop-R1 terms) the whole batch
    goes to the update as it is: s(r) and the advantages (step_rewards.totals_and_advantages) are computed in that
    call, from a no-grad forward first (learner_logits) or from the update's own forward (update_logits). Otherwise
    (topk_logprobs, a plug-in `reward.fn`) the advantages of the rewards' own totals are computed here."""
    zeros = torch.zeros(len(scored), cfg.rollout.group_size, dtype=torch.float64)
    batch = build_grpo_batch(scored, zeros, pad_id, cfg.rollout.temperature)
    if update_self_certainty_applies(cfg, score_fn) or learner_self_certainty_applies(cfg, score_fn):
        return PreparedUpdate(scored, None, batch)    # s(r) and the advantages in the update's own call
    owned = step_rewards.totals_and_advantages(StepRewards.of(scored), cfg.rl.advantage_config(cfg.reward),
                                               None)                  # totals (the engines' s(r)), advantages
    return PreparedUpdate(with_step_rewards(scored, owned.rewards), owned.advantages,
                          update_batch(batch, owned.advantages, cfg))


def step_metrics(scored: list[ScoredGeneration], rollout: StepRollout, update: GRPOStepStats, adv: Any, synced: Any,
                 engine_restarts: int, t: tuple[float, float, float, float, float], push_wait_s: float = 0.0
                 ) -> dict[str, float]:
    """One step's logged figures. t = the clock at the step's start, after generate + score, after the advantages,
    after the update, after the weight sync: the timing/* stages sum to timing/step.

    One-step-off (the rollout was made beside the previous update): timing/rollout is what this step waited for
    rollouts (taking its own, and before the push, the next one's: `push_wait_s`), timing/reward 0, and
    timing/rollout_overlapped the generate + score time that ran beside the update."""
    t0, t1, t2, t3, t4 = t
    step = rollout.step
    made = rollout.batch
    lags = [step - 1 - c.policy_version for s in scored for c in s.generation.completions]
    overlapped = rollout.version < step - 1
    metrics = rollout_metrics(scored)
    metrics.update(rollout.batch.failures.metrics())  # counted once per step (ScoredBatch.failures)
    metrics.update({"rollout/engine_restarts": engine_restarts,
                    "rollout/policy_lag_mean": sum(lags) / max(len(lags), 1),
                    "rollout/policy_lag_max": max(lags, default=0),
                    "train/skipped_update": float(update is SKIPPED or bool(update.nonfinite)),
                    **finite.metrics(update.nonfinite), "train/loss": update.loss,
                    "train/kl": update.kl, "train/clip_fraction": update.clip_fraction,
                    "train/ratio_mean": update.ratio_mean, "train/grad_norm": update.grad_norm,
                    "train/zero_signal_groups": adv.num_zero_signal_groups,
                    "train/advantage_abs_max": float(adv.advantages.abs().max()) if adv.advantages.numel() else 0.0,
                    "train/sampler_logprob_abs_diff_mean": update.sampler_logprob_abs_diff_mean,
                    "train/sampler_logprob_abs_diff_max": update.sampler_logprob_abs_diff_max,
                    "train/is_weight_mean": update.is_weight_mean,
                    "train/is_truncated_fraction": update.is_truncated_fraction,
                    "timing/advantages": t2 - t1, "timing/update": t3 - t2, "timing/step": t4 - t0,
                    "throughput/generated_tokens_per_s": sum(len(c.token_ids) for s in scored
                                                             for c in s.generation.completions) / made.generate_s,
                    "weight_sync/bytes": synced.num_bytes, **synced.phase_metrics(), "policy_version": rollout.version})
    if overlapped or push_wait_s:
        metrics.update({"timing/rollout": (t1 - t0) + push_wait_s, "timing/reward": 0.0,
                        "timing/weight_sync": (t4 - t3) - push_wait_s, "timing/other": 0.0,
                        # Only a rollout made beside the previous update overlapped (not step 1's, nor after resume).
                        "timing/rollout_overlapped": made.generate_s + made.reward_wait_s if overlapped else 0.0})
    else:
        metrics.update({"timing/rollout": made.generate_s, "timing/reward": made.reward_wait_s,
                        "timing/weight_sync": t4 - t3,
                        # The rest of the step: what no stage above counts.
                        "timing/other": (t4 - t0) - (made.generate_s + made.reward_wait_s + (t4 - t1))})
    return metrics


def run_grpo(cfg: Config, policy_path: str, prompts: list[Prompt], out_dir: str | Path, local: bool,
             resume: bool = False, pad_id: int = 0, score_fn: ScoreFn | None = None,
             engine_cls: type | None = None, learner_cls: type | None = None,
             val_prompts: list[Prompt] | None = None,
             reward_funcs: Sequence[RewardFunction | RewardTerm] = (), engines: EngineGroup | None = None
             ) -> GRPOResult:
    """Needs Ray started (or `local`). `policy_path` is the SFT model: the initial policy and the reference.

    `score_fn` scores each response's base terms (default: `reward.fn`, whose default is the Shop-R1 hybrid reward).
    `reward_funcs`: reward functions of your own, TRL-style (shop_r1/reward/functions.py), added to the total with
    `reward.functions` (a plain function weighs 1; a RewardTerm carries its weight), each logged as reward/<name>.
    `val_prompts`: encoded like `prompts`, from a validation split; with rl.val_every > 0 the first
    rl.val_examples of them are answered greedily every rl.val_every steps (`validate`).
    `engine_cls` / `learner_cls` replace the vLLM engine / DeepSpeed learner actors (fault tests).
    `engines`: a running engine group of the caller's (built for this config's rollout settings and context), used
    instead of starting one and left running afterwards: its weights and policy version are the learner's from the
    run's first push on, and its restart count starts again at 0 (rollout.max_engine_restarts is per run). Several
    runs in one process (tests, sweeps) then pay for the engines' start once.

    An actor the loop cannot replace (a learner rank) that dies ends the attempt; its actors are torn down and the run
    resumes from the last complete checkpoint, up to `rl.max_restarts` times. Steps after that checkpoint run again
    (their log lines appear again in metrics_grpo.jsonl and rollouts.jsonl; the last occurrence is the one kept).
    """
    from shop_r1.distributed.actors import with_restarts

    score_fn = score_fn if score_fn is not None else load_score_fn(cfg.reward.fn)
    check_config(cfg, "train", prompts=prompts, val_prompts=val_prompts, local=local,  # before any actor starts
                 extra_problems=reward_function_problems(cfg.reward, prompts, reward_funcs))
    terms = terms_of(cfg.reward, reward_funcs)
    if engines is not None:
        check_given_engines(engines, cfg, policy_path, local, engine_cls)
    val = val_prompts[:cfg.rl.val_examples] if cfg.rl.val_every and val_prompts else []
    return with_restarts(lambda again: _run_grpo_attempt(cfg, policy_path, prompts, out_dir, local, resume or again,
                                                         pad_id, score_fn, engine_cls, learner_cls, val, terms,
                                                         engines),
                         cfg.rl.max_restarts, local, "grpo")


def check_given_engines(engines: EngineGroup, cfg: Config, policy_path: str, local: bool,
                        engine_cls: type | None) -> None:
    """A caller's engine group must be what this run would start: the config's engine count, local mode and rollout
    settings, a context at least the run's, and no `engine_cls` beside it."""
    from shop_r1.rollout.engine import max_model_len

    context = max_model_len(cfg, policy_path)
    problems = [*(["engine_cls is given as well (the given engines are already built)"] if engine_cls else []),
                *([f"they run {'in-process' if engines.local else 'under Ray'}, the run is "
                   f"{'local' if local else 'under Ray'}"] if engines.local != local else []),
                *([f"{len(engines.engines)} engine(s), rollout.num_engines={cfg.rollout.num_engines}"]
                  if len(engines.engines) != cfg.rollout.num_engines else []),
                *([f"their context is {engines.max_model_len} tokens, the run needs {context}"]
                  if engines.max_model_len < context else []),
                *([f"they were built with other rollout settings ({differ})"]
                  if (differ := _build_settings_diff(engines.cfg, cfg.rollout)) else [])]
    if problems:
        raise ValueError("run_grpo(engines=...): the given engine group does not fit this run: " + "; ".join(problems))


PER_REQUEST_ROLLOUT = ("temperature", "max_new_tokens", "group_size")
"""Rollout settings each generate call carries (SamplingSpec): a run may differ from its given engines in these."""


def _build_settings_diff(built: Any, wanted: Any) -> str:
    return ", ".join(f"rollout.{f.name}: {getattr(built, f.name)!r} vs {getattr(wanted, f.name)!r}"
                     for f in dataclasses.fields(built)
                     if f.name not in PER_REQUEST_ROLLOUT and getattr(built, f.name) != getattr(wanted, f.name))


def validate(engines: Engines, prompts: list[Prompt], cfg: Config, version: int) -> dict[str, float]:
    """`val/*` of greedy answers to the fixed validation subset, by the engines' current weights (checked: every
    answer carries policy `version`, the weights just pushed). Nothing is in flight on the engines here (the
    driver calls it after the push), and greedy decoding draws no random numbers, so a resumed run is unchanged."""
    start = time.perf_counter()
    spec = SamplingSpec(n=1, temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens, top_k_logprobs=0,
                        seed=cfg.seed)
    gens = engines.generate([p.token_ids for p in prompts], spec)
    seen = {c.policy_version for g in gens for c in g.completions}
    if seen - {version}:
        raise PolicyVersionMismatch(f"validation after step {version}: answers by policy versions {sorted(seen)}")
    metrics = validation_metrics([g.completions[0].text for g in gens], [p.target for p in prompts])
    return {**metrics, "val/seconds": time.perf_counter() - start}


@dataclass
class _RunFiles:
    """The run's append-only logs: which prompts each step took, and the per-sample rollout dump."""

    batches: Any
    rollouts: Any

    @classmethod
    def open(cls, out: Path, run_dir: str) -> _RunFiles:
        out.mkdir(parents=True, exist_ok=True)
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        return cls(open(out / "batches.jsonl", "a", encoding="utf-8"),
                   open(Path(run_dir) / "rollouts.jsonl", "a", encoding="utf-8"))

    def write(self, step: int, prompts: list[Prompt], scored: list[ScoredGeneration], advantages: list) -> None:
        self.batches.write(json.dumps({"step": step, "example_ids": [p.example_id for p in prompts]}) + "\n")
        self.batches.flush()
        self.rollouts.writelines(json.dumps(r) + "\n" for r in rollout_records(step, scored, advantages))
        self.rollouts.flush()

    def close(self) -> None:
        self.batches.close()
        self.rollouts.close()


def _run_grpo_attempt(cfg: Config, policy_path: str, prompts: list[Prompt], out_dir: str | Path, local: bool,
                      resume: bool, pad_id: int, score_fn: ScoreFn, engine_cls: type | None,
                      learner_cls: type | None, val_prompts: list[Prompt], terms: tuple[RewardTerm, ...] = (),
                      given: EngineGroup | None = None) -> GRPOResult:
    from shop_r1.rollout.engine import max_model_len

    start_time = time.perf_counter()
    out, group_size, ckpt_root = Path(out_dir), cfg.rollout.group_size, Path(out_dir) / "checkpoints"
    print(f"  starting {cfg.rollout.num_engines} rollout engine(s) (vLLM), {cfg.reward_pool.num_workers} reward "
          f"worker(s), {cfg.learner.num_ranks} learner rank(s) with the reference policy ({cfg.learner.backend}), "
          "and the weight-sync group", flush=True)
    # Whatever was started is torn down on the way out, a failure during start-up included (a restart must not leave
    # the previous attempt's actors running).
    engines = pool = learners = source = tracker = files = None
    try:
        if given is None:
            engines = EngineGroup(policy_path, cfg.rollout, max_model_len(cfg, policy_path), cfg.seed, local=local,
                                  engine_cls=engine_cls)
        else:  # the caller's: kept running afterwards, its restart budget this run's
            engines, given.restarts = given, 0
        pool = RewardPool(cfg.reward, cfg.reward_pool, local=local, score_fn=score_fn, terms=terms)
        # The schedule counts optimizer steps: rl.num_minibatches of them a GRPO step.
        learners = LearnerGroup(policy_path, cfg.learner, cfg.rl.lr, cfg.rl.steps * cfg.rl.num_minibatches, cfg.seed,
                                warmup_steps=cfg.rl.warmup_steps * cfg.rl.num_minibatches, local=local,
                                reference_path=policy_path, learner_cls=learner_cls)
        sync: WeightSync = weight_sync_from_config(cfg, learners, engines, local)
        threads = {"threads/engine_min": min(engines.num_threads()),
                   "threads/learner_min": min(learners.num_threads())}
        print(f"  threads (torch.get_num_threads): engines {threads['threads/engine_min']}, learner ranks "
              f"{threads['threads/learner_min']}", flush=True)
        sampler = PromptSampler(len(prompts), max(1, cfg.rl.global_batch_size // group_size), cfg.seed)
        step, pending = _resume(ckpt_root, learners, sampler) if resume else (_fresh(ckpt_root), None)
        first = sync.push(step)  # engines start from exactly the learner's weights
        if getattr(first, "load_path", ""):
            print(f"  weight sync: engines load {first.load_path} (rollout.weight_load={cfg.rollout.weight_load})",
                  flush=True)
        # A per-step sampling seed makes a resumed run draw the samples the uninterrupted run would have; strided by the
        # group size so that no two steps share a sample's random stream (step_sampling_seed).
        source = RolloutStream(engines, pool, sampler, prompts, lambda t: SamplingSpec(
            n=group_size, temperature=cfg.rollout.temperature, seed=step_sampling_seed(cfg.seed, t, group_size),
            max_new_tokens=cfg.rollout.max_new_tokens, top_k_logprobs=cfg.rollout.top_k_logprobs),
            cfg.rl.async_level, cfg.rl.steps, local, version=step, pending=pending)
        tracker = Tracker(cfg.run_dir, cfg.logging, "grpo", config_to_dict(cfg), total_steps=cfg.rl.steps,
                          first_step=step)
        files, rewards_seen = _RunFiles.open(out, cfg.run_dir), []
        learner_step = step  # updates the learner has applied (ahead of `step`'s log line between update and log)
        nonfinite = finite.NonFiniteStreak(cfg.rl.max_nonfinite_steps)
        if val_prompts and step == 0:  # the SFT policy's figures; a resumed run logged its step's before stopping
            tracker.log(0, validate(engines, val_prompts, cfg, version=0))
        while step < cfg.rl.steps:
            step += 1
            t0 = time.perf_counter()
            rollout = source.take(step)                                                     # generate + score
            t1 = time.perf_counter()
            scored = checked_rollout(rollout, cfg)
            prepared = prepare_update(scored, learners, cfg, pad_id, score_fn)             # s(r), advantages
            t2 = time.perf_counter()
            scored, adv, update = update_step(learners, prepared, cfg)                     # learner update
            t3, learner_step = time.perf_counter(), step
            changed = update is not SKIPPED and not update.nonfinite
            synced = source.push(sync, step, changed=changed)                              # weight sync
            metrics = step_metrics(scored, rollout, update, adv, synced, engines.restarts,
                                   (t0, t1, t2, t3, time.perf_counter()), source.push_wait_s)
            if cfg.rl.check_weight_sync:
                metrics.update(check_weight_sync(engines, learners, rollout.prompts[0], step, pad_id))
            if val_prompts and (step % cfg.rl.val_every == 0 or step == cfg.rl.steps):     # validation
                metrics.update(validate(engines, val_prompts, cfg, version=step))
            tracker.log(step, {**metrics, **threads})                                      # log
            files.write(step, rollout.prompts, scored, adv.advantages.tolist())
            rewards_seen.append(metrics["reward/total"])
            nonfinite.observe(step, update.nonfinite)  # too many skipped updates in a row: stop (logged first)
            if step % cfg.rl.checkpoint_every == 0 or step == cfg.rl.steps:                # checkpoint
                _checkpoint(cfg, ckpt_root, learners, _state_after(step, sampler), source.pending_bytes())
        learners.save_hf(str(out / "hf"))
    except EngineFailure:  # past rollout.max_engine_restarts: keep what the learner reached, then stop
        if source is not None:  # (a failure while starting up has nothing new to keep)
            _checkpoint_on_failure(cfg, ckpt_root, learners, source, sampler, learner_step)
        raise
    finally:
        for part in (source, tracker, files):
            if part is not None:
                part.close()
        if given is not None:
            given.on_replace, given.defer_resync, given.resync_pending = None, False, False  # no link to this run
        for group in (engines if given is None else None, pool, learners):
            if group is not None:
                group.shutdown()
    return GRPOResult(str(out / "hf"), step, rewards_seen[0] if rewards_seen else 0.0,
                      rewards_seen[-1] if rewards_seen else 0.0, time.perf_counter() - start_time)


def update_step(learners: Learners, prepared: PreparedUpdate, cfg: Config
                ) -> tuple[list[ScoredGeneration], GroupAdvantages, GRPOStepStats]:
    """The learner's update of the prepared batch, and the step's scored groups and advantages: as prepared, or, where
    the update computes them (prepared.adv is None), with the update's exact s(r) and its advantages."""
    if prepared.adv is not None:
        return prepared.scored, prepared.adv, learner_update(learners, prepared.batch, prepared.scored, prepared.adv,
                                                             cfg)
    return update_from_own_logits(learners, prepared.batch, prepared.scored, cfg)


def update_from_own_logits(learners: Learners, batch: GRPOBatch, scored: list[ScoredGeneration], cfg: Config
                           ) -> tuple[list[ScoredGeneration], GroupAdvantages, GRPOStepStats]:
    """reward.self_certainty.source=update_logits: the learner takes the step's whole batch and its rewards, takes
    each response's exact s(r) from the update's own forward, computes the advantages (the same function as
    `step_advantages`), trains, and returns them; the scored groups are re-formed here with the same s(r), so the
    logs and the rollout dump read as under learner_logits. A step it did not train (nothing left, or a NaN/inf reward
    or advantage) is SKIPPED as `learner_update` reports it."""
    loss_cfg, adv_cfg = cfg.rl.loss_config(cfg.rollout.max_new_tokens), cfg.rl.advantage_config(cfg.reward)
    if cfg.reward.self_certainty.source == "update_logits":
        out = learners.grpo_step_with_self_certainty(batch, loss_cfg, StepRewards.of(scored), adv_cfg)[0]
    else:  # learner_logits: a no-grad forward for s(r), then the update, in the same call
        out = learners.grpo_step_after_self_certainty(batch, loss_cfg, StepRewards.of(scored), adv_cfg,
                                                      cfg.rl.loss_tokens == "action")[0]
    scored = with_learner_self_certainty(scored, out.self_certainty, cfg)
    if out.updated:
        update = out.stats
    else:
        update = dataclasses.replace(SKIPPED, nonfinite=out.stats.nonfinite) if out.stats.nonfinite else SKIPPED
    return scored, out.advantages, update


def learner_update(learners: Learners, batch: GRPOBatch, scored: list[ScoredGeneration], adv: GroupAdvantages,
                   cfg: Config) -> GRPOStepStats:
    """The learner's update, or SKIPPED when there is nothing to learn from (every group dropped) or when a reward or
    advantage is NaN/inf (SKIPPED with `nonfinite` naming it: no update; the learner skips its own optimizer step
    the same way on a non-finite loss or gradient norm)."""
    cause = finite.driver_cause(_rewards(scored), adv.advantages)
    if cause:
        return dataclasses.replace(SKIPPED, nonfinite=cause)
    if not batch.num_responses:
        return SKIPPED
    return learners.grpo_step(batch, cfg.rl.loss_config(cfg.rollout.max_new_tokens))[0]


def checked_rollout(rollout: StepRollout, cfg: Config) -> list[ScoredGeneration]:
    """The rollout's scored groups, once the engines' version stamps (the policy lag is at most rl.async_level) and
    the reward workers' failure count have been checked."""
    scored = rollout.batch.scored
    check_policy_versions(scored, expected=rollout.version)
    lag = rollout.step - 1 - rollout.version
    if not 0 <= lag <= cfg.rl.async_level:
        raise PolicyVersionMismatch(f"step {rollout.step} was sampled by policy version {rollout.version}: a lag of "
                                    f"{lag} steps, rl.async_level={cfg.rl.async_level} allows at most "
                                    f"{cfg.rl.async_level}")
    rollout.batch.failures.check(cfg.reward_pool.max_failed_fraction, where=f"GRPO step {rollout.step}")
    return scored


def _resume(ckpt_root: Path, learners: Learners, sampler: PromptSampler) -> tuple[int, StepRollout | None]:
    """The step, data cursor, RNG, learner state (and the next step's rollout, if made) of the newest checkpoint."""
    found = checkpoint.latest(ckpt_root)
    if found is None:
        return 0, None
    state = checkpoint.load_state(found)
    learners.load_checkpoint(str(found / checkpoint.LEARNER_DIR))
    checkpoint.restore_rng(state.rng)
    sampler.cursor = Cursor(state.cursor_epoch, state.cursor_position)
    moved = checkpoint.abandon_later_checkpoints(ckpt_root, state.step)
    print(f"resumed from {found} (step {state.step})" +
          (f"; later checkpoints of the abandoned timeline moved to {moved[0].parent}" if moved else ""), flush=True)
    return state.step, load_pending(checkpoint.read_extra(found, PENDING_ROLLOUT), where=found / PENDING_ROLLOUT)


def _fresh(ckpt_root: Path) -> int:
    """A run started afresh in a folder with checkpoints: they are moved aside (never deleted), not mixed in."""
    moved = checkpoint.abandon_later_checkpoints(ckpt_root, 0)
    if moved:
        print(f"GRPO starts afresh: {len(moved)} earlier checkpoint(s) moved to {moved[0].parent}", flush=True)
    return 0


def _checkpoint_on_failure(cfg: Config, ckpt_root: Path, learners: Learners, source: RolloutStream,
                           sampler: PromptSampler, learner_step: int) -> None:
    """The engines failed for good: checkpoint the learner's last update, labelled with its step. When the rollout in
    flight is what failed, its prompts are drawn again on resume (the cursor before them); when the failure came
    later (a weight push, after the update), the step's prompts are used up and the update is in the checkpoint
    (its log line is not written)."""
    before = source.last_before
    if before is not None and before.step == learner_step:
        state, pending = before, None
    else:
        state, pending = _state_after(learner_step, sampler), source.pending_bytes()
    if state.step > 0 and checkpoint.latest(ckpt_root) != ckpt_root / f"step_{state.step:06d}":
        _checkpoint(cfg, ckpt_root, learners, state, pending)


def _state_after(step: int, sampler: PromptSampler) -> checkpoint.TrainState:
    return checkpoint.TrainState(step, sampler.cursor.epoch, sampler.cursor.position, checkpoint.capture_rng())


def _checkpoint(cfg: Config, ckpt_root: Path, learners: Learners, state: checkpoint.TrainState,
                pending: bytes | None) -> None:
    # Never publish NaN/inf weights: the previous checkpoint stays the latest.
    finite.check_weights_finite(learners.nonfinite_weights(), f"GRPO step {state.step}", checkpoint.latest(ckpt_root))
    checkpoint.save(ckpt_root, state, config_to_dict(cfg),
                    lambda d: learners.save_checkpoint(d, {"step": state.step}),
                    extra={PENDING_ROLLOUT: pending} if pending is not None else None)
    checkpoint.prune(ckpt_root, cfg.rl.keep_checkpoints)  # only after the newer one is complete
    mirror_or_warn(cfg.run_dir, cfg.storage_uri)
