"""`shop-r1 train`: GRPO with the Shop-R1 hybrid reward (paper Eq. 4), as a Ray actor/learner loop.

    prompts -> engines generate G samples each -> reward pool scores them -> group advantages
            -> learner update (clipped surrogate + beta * KL to the frozen SFT policy) -> weight sync -> log -> ckpt

Backends and placement are chosen once, before the loop. `rl.global_batch_size` counts responses (P x G).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shop_r1 import checkpoint
from shop_r1.algo.advantages import group_advantages
from shop_r1.algo.batch import build_grpo_batch
from shop_r1.config import Config, config_to_dict
from shop_r1.data.sampler import Cursor, PromptSampler
from shop_r1.distributed.engine_group import EngineFailure, EngineGroup
from shop_r1.distributed.learner_group import LearnerGroup
from shop_r1.distributed.reward_pool import RewardPool
from shop_r1.distributed.weight_sync import make_weight_sync
from shop_r1.reward.scorer import with_exact_self_certainty
from shop_r1.reward.worker import ScoreFn, load_score_fn
from shop_r1.rollout.metrics import rollout_metrics
from shop_r1.rollout.records import check_policy_versions, rollout_records
from shop_r1.reward.failures import check_failed_fraction, failure_counts
from shop_r1.storage import mirror_or_warn
from shop_r1.tracking import Tracker
from shop_r1.types import GRPOStepStats, Prompt, RewardBreakdown, SamplingSpec, ScoredGeneration


SKIPPED = GRPOStepStats(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_mean=1.0, grad_norm=0.0, num_tokens=0, step=0)


@dataclass(frozen=True)
class GRPOResult:
    hf_dir: str
    num_steps: int
    first_reward: float
    last_reward: float
    seconds: float


def check_sampling_config(cfg: Config) -> None:
    """s(r) is defined on the temperature-1 distribution, but the engines return the sampling distribution's
    logprobs (temperature T): the top-k estimate is only that of s(r) when T = 1."""
    from shop_r1.config import ConfigError, check_ranges

    check_ranges(cfg)  # a Config built in code gets the same range checks as a loaded one
    if cfg.reward.self_certainty.source == "topk_logprobs" and cfg.rollout.temperature != 1.0:
        raise ConfigError(f"reward.self_certainty.source=topk_logprobs needs rollout.temperature=1 (got "
                          f"{cfg.rollout.temperature}): the engines' top-k logprobs are those of the sampling "
                          "distribution; use reward.self_certainty.source=learner_logits (exact, at temperature 1)")


def with_learner_self_certainty(scored: list[ScoredGeneration], certainty: list[float], cfg: Config
                                ) -> list[ScoredGeneration]:
    """certainty[i] (one per response, in batch order) replaces the i-th response's s(r); totals re-formed."""
    if len(certainty) != sum(len(s.rewards) for s in scored):
        raise ValueError(f"{len(certainty)} self-certainty values for {sum(len(s.rewards) for s in scored)} responses")
    out, start = [], 0
    for s in scored:
        stop = start + len(s.rewards)
        out.append(dataclasses.replace(s, rewards=tuple(with_exact_self_certainty(s.rewards, certainty[start:stop],
                                                                                  cfg.reward))))
        start = stop
    return out


def _rewards(scored: list[ScoredGeneration]) -> torch.Tensor:
    return torch.tensor([[r.total for r in s.rewards] for s in scored], dtype=torch.float64)  # [P, G]


def check_weight_sync(engines: EngineGroup, learners: LearnerGroup, probe: Prompt, step: int, pad_id: int
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


def exact_self_certainty(scored: list[ScoredGeneration], learners: LearnerGroup, cfg: Config, temperature: float,
                         pad_id: int) -> list[ScoredGeneration]:
    """With `reward.self_certainty.source=learner_logits` (the default), replace each response's s(r) by the exact
    value from the policy's full logits at temperature 1 (one no-grad forward), and re-form the totals."""
    if cfg.reward.self_certainty.source != "learner_logits":
        return scored
    zeros = torch.zeros(len(scored), cfg.rollout.group_size, dtype=torch.float64)
    values = learners.rationale_self_certainty(build_grpo_batch(scored, zeros, pad_id, temperature),
                                               cfg.reward.self_certainty.direction,
                                               cfg.reward.self_certainty.normalize_by_vocab)
    return with_learner_self_certainty(scored, values, cfg)


def update_batch(scored: list[ScoredGeneration], adv: Any, cfg: Config, temperature: float, pad_id: int) -> Any:
    """The learner's batch: every response with its advantage, minus the groups without signal when
    `rl.drop_zero_signal_groups` (all equal rewards: zero advantages, nothing to learn)."""
    batch = build_grpo_batch(scored, adv.advantages, pad_id, temperature)
    if not cfg.rl.drop_zero_signal_groups:
        return batch
    g = cfg.rollout.group_size
    return batch.select([p * g + i for p in range(len(scored)) if not adv.zero_signal[p] for i in range(g)])


def step_metrics(scored: list[ScoredGeneration], rollout: Any, update: GRPOStepStats, adv: Any, synced: Any,
                 version: int, engine_restarts: int, t: tuple[float, float, float, float, float]) -> dict[str, float]:
    """One step's logged figures. t = the clock at the step's start, after generate + score, after the advantages,
    after the update, after the weight sync: the timing/* stages sum to timing/step."""
    t0, t1, t2, t3, t4 = t
    metrics = rollout_metrics(scored)
    metrics.update(failure_counts([r for s in scored for r in s.rewards]))
    metrics.update({"rollout/engine_restarts": engine_restarts,
                    "train/skipped_update": float(update is SKIPPED), "train/loss": update.loss,
                    "train/kl": update.kl, "train/clip_fraction": update.clip_fraction,
                    "train/ratio_mean": update.ratio_mean, "train/grad_norm": update.grad_norm,
                    "train/zero_signal_groups": adv.num_zero_signal_groups,
                    "train/sampler_logprob_abs_diff_mean": update.sampler_logprob_abs_diff_mean,
                    "train/sampler_logprob_abs_diff_max": update.sampler_logprob_abs_diff_max,
                    "timing/rollout": rollout.generate_s, "timing/reward": rollout.reward_wait_s,
                    "timing/advantages": t2 - t1, "timing/update": t3 - t2, "timing/weight_sync": t4 - t3,
                    "timing/step": t4 - t0,
                    # The rest of the step: what no stage above counts.
                    "timing/other": (t4 - t0) - (rollout.generate_s + rollout.reward_wait_s + (t4 - t1)),
                    "throughput/generated_tokens_per_s": sum(len(c.token_ids) for s in scored
                                                             for c in s.generation.completions) / (t1 - t0),
                    "weight_sync/bytes": synced.num_bytes, "policy_version": version})
    return metrics


def run_grpo(cfg: Config, policy_path: str, prompts: list[Prompt], out_dir: str | Path, local: bool,
             resume: bool = False, pad_id: int = 0, score_fn: ScoreFn | None = None,
             engine_cls: type | None = None, learner_cls: type | None = None) -> GRPOResult:
    """Needs Ray started (or `local`). `policy_path` is the SFT model: the initial policy and the reference.

    `score_fn` is the reward (default: `reward.fn`, whose default is the Shop-R1 hybrid reward).
    `engine_cls` / `learner_cls` replace the vLLM engine / DeepSpeed learner actors (fault tests).

    An actor the loop cannot replace (a learner rank) that dies ends the attempt; its actors are torn down and the run
    resumes from the last complete checkpoint, up to `rl.max_restarts` times. Steps after that checkpoint run again
    (their log lines appear again in metrics_grpo.jsonl and rollouts.jsonl; the last occurrence is the one kept).
    """
    from shop_r1.distributed.actors import is_actor_death

    score_fn = score_fn if score_fn is not None else load_score_fn(cfg.reward.fn)
    for attempt in range(cfg.rl.max_restarts + 1):
        try:
            return _run_grpo_attempt(cfg, policy_path, prompts, out_dir, local, resume or attempt > 0, pad_id,
                                     score_fn, engine_cls, learner_cls)
        except Exception as e:  # noqa: BLE001 - only an actor's death is retried, the rest re-raised
            if local or not is_actor_death(e) or attempt == cfg.rl.max_restarts:
                raise
            print(f"[grpo] an actor died ({type(e).__name__}: {str(e).splitlines()[0][:200]}); actors torn down, "
                  f"resuming from the last checkpoint (restart {attempt + 1} of at most {cfg.rl.max_restarts})",
                  flush=True)
    raise AssertionError("unreachable")


def _run_grpo_attempt(cfg: Config, policy_path: str, prompts: list[Prompt], out_dir: str | Path, local: bool,
                      resume: bool, pad_id: int, score_fn: ScoreFn, engine_cls: type | None,
                      learner_cls: type | None) -> GRPOResult:
    from shop_r1.rollout.engine import max_model_len

    check_sampling_config(cfg)
    start_time = time.perf_counter()
    out, group_size = Path(out_dir), cfg.rollout.group_size
    prompts_per_step = max(1, cfg.rl.global_batch_size // group_size)
    print(f"  starting {cfg.rollout.num_engines} rollout engine(s) (vLLM), {cfg.reward_pool.num_workers} reward "
          f"worker(s), {cfg.learner.num_ranks} learner rank(s) with the reference policy (DeepSpeed), and the "
          "weight-sync group", flush=True)
    engines = EngineGroup(policy_path, cfg.rollout, max_model_len(cfg, policy_path), cfg.seed, local=local,
                          engine_cls=engine_cls)
    pool = RewardPool(cfg.reward, cfg.reward_pool, local=local, score_fn=score_fn)
    learners = LearnerGroup(policy_path, cfg.learner, cfg.rl.lr, cfg.rl.steps, cfg.seed, local=local,
                            reference_path=policy_path, learner_cls=learner_cls)
    sync = make_weight_sync(learners, engines, cfg.rl.weight_sync_bucket_mb << 20, local, torch.cuda.is_available())
    sampler, step = PromptSampler(len(prompts), prompts_per_step, cfg.seed), 0
    ckpt_root = out / "checkpoints"
    if resume and (found := checkpoint.latest(ckpt_root)) is not None:
        state = checkpoint.load_state(found)
        learners.load_checkpoint(str(found / "deepspeed"))
        checkpoint.restore_rng(state.rng)
        sampler.cursor, step = Cursor(state.cursor_epoch, state.cursor_position), state.step
        print(f"resumed from {found} (step {step})", flush=True)
    sync.push(step)  # engines start from exactly the learner's weights
    tracker = Tracker(cfg.run_dir, cfg.logging, "grpo", config_to_dict(cfg), total_steps=cfg.rl.steps,
                      first_step=step)
    out.mkdir(parents=True, exist_ok=True)
    batches_log = open(out / "batches.jsonl", "a", encoding="utf-8")
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    rollouts_log = open(Path(cfg.run_dir) / "rollouts.jsonl", "a", encoding="utf-8")
    rewards_seen: list[float] = []
    try:
        while step < cfg.rl.steps:
            step += 1
            t0 = time.perf_counter()
            before = checkpoint.TrainState(step - 1, sampler.cursor.epoch, sampler.cursor.position,
                                           checkpoint.capture_rng())  # what a checkpoint of step - 1 holds
            indices = sampler.next_batch()
            batch_prompts = [prompts[i] for i in indices]                                    # take prompts
            # A per-step sampling seed makes a resumed run draw the samples the uninterrupted run would have.
            spec = SamplingSpec(n=group_size, temperature=cfg.rollout.temperature, seed=cfg.seed * 100_003 + step,
                                max_new_tokens=cfg.rollout.max_new_tokens, top_k_logprobs=cfg.rollout.top_k_logprobs)
            try:
                rollout = engines.generate_scored(batch_prompts, spec, pool)                # generate + score
            except EngineFailure:  # past rollout.max_engine_restarts: keep what step - 1 reached, then stop
                if before.step > 0 and checkpoint.latest(ckpt_root) != ckpt_root / f"step_{before.step:06d}":
                    checkpoint.save(ckpt_root, before, config_to_dict(cfg),
                                    lambda d: learners.save_checkpoint(d, {"step": before.step}))
                raise
            scored = rollout.scored
            t1 = time.perf_counter()
            version = check_policy_versions(scored, expected=step - 1)  # sampled by the weights pushed last
            check_failed_fraction([r for s in scored for r in s.rewards], cfg.reward_pool.max_failed_fraction,
                                  where=f"GRPO step {step}")
            scored = exact_self_certainty(scored, learners, cfg, spec.temperature, pad_id)   # s(r) at T = 1
            adv = group_advantages(_rewards(scored))                                         # advantages
            batch = update_batch(scored, adv, cfg, spec.temperature, pad_id)
            t2 = time.perf_counter()
            # With every group dropped there is nothing to learn from: the update is skipped (and counted).
            update = learners.grpo_step(batch, cfg.rl)[0] if batch.num_responses else SKIPPED  # learner update
            t3 = time.perf_counter()
            # A skipped update left the weights as they were: the engines only take the new version number.
            synced = sync.push(step) if update is not SKIPPED else sync.bump(step)          # weight sync
            t4 = time.perf_counter()
            metrics = step_metrics(scored, rollout, update, adv, synced, version, engines.restarts,
                                   (t0, t1, t2, t3, t4))                                     # log
            if cfg.rl.check_weight_sync:
                metrics.update(check_weight_sync(engines, learners, batch_prompts[0], step, pad_id))
            tracker.log(step, metrics)
            batches_log.write(json.dumps({"step": step, "example_ids": [p.example_id for p in batch_prompts]}) + "\n")
            batches_log.flush()
            dump = rollout_records(step, scored, adv.advantages.tolist())
            rollouts_log.writelines(json.dumps(r) + "\n" for r in dump)
            rollouts_log.flush()
            rewards_seen.append(metrics["reward/total"])
            if step % cfg.rl.checkpoint_every == 0 or step == cfg.rl.steps:                # checkpoint
                checkpoint.save(ckpt_root, checkpoint.TrainState(step, sampler.cursor.epoch, sampler.cursor.position,
                                                                 checkpoint.capture_rng()),
                                config_to_dict(cfg), lambda d: learners.save_checkpoint(d, {"step": step}))
                checkpoint.prune(ckpt_root, cfg.rl.keep_checkpoints)  # only after the newer one is complete
                mirror_or_warn(cfg.run_dir, cfg.storage_uri)
        learners.save_hf(str(out / "hf"))
    finally:
        tracker.close()
        batches_log.close()
        rollouts_log.close()
        engines.shutdown()
        pool.shutdown()
        learners.shutdown()
    return GRPOResult(str(out / "hf"), step, rewards_seen[0] if rewards_seen else 0.0,
                      rewards_seen[-1] if rewards_seen else 0.0, time.perf_counter() - start_time)
