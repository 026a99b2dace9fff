"""`shop-r1 eval`: generate on held-out RL examples with the engine group, parse, score, and report.

Writes into `out_dir`: `predictions.jsonl` (one line per example: id, response, target, reward terms),
`metrics.json` (exact match, type accuracy, macro-F1, per type as in Tables 2-3, plus mean reward terms) and
`metrics.txt` (a readable table). With eval.headroom_examples > 0 it also draws rollout.group_size samples at
rollout.temperature on a seeded sample of that many examples: `samples.jsonl` (their texts) and `headroom.json`
(pass@1, sample exact, pass@k per target type: shop_r1/headroom.py), also in metrics.txt. Zero-shot prompting is this
command on an untrained model.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shop_r1.comparison import Comparison
from shop_r1.config import Config
from shop_r1.distributed.engine_group import EngineGroup
from shop_r1.distributed.reward_pool import RewardPool
from shop_r1.headroom import Headroom, compute_headroom, format_headroom
from shop_r1.metrics import EvalMetrics, compute_metrics, format_metrics_table
from shop_r1.rollout.engine import max_model_len
from shop_r1.rollout.metrics import REWARD_TERMS
from shop_r1.types import RewardBreakdown, SamplingSpec, ScoredGeneration


@dataclass(frozen=True)
class EvalReport:
    label: str
    metrics: EvalMetrics
    reward_means: dict[str, float]
    num_reward_failures: int
    predictions_path: str
    metrics_path: str
    seconds: float
    headroom: Headroom | None = None


def headroom_indices(n: int, k: int, seed: int) -> list[int]:
    """Which of n evaluated examples get samples: k of them drawn with `seed`, in file order (all when k >= n)."""
    import random

    return list(range(n)) if k >= n else sorted(random.Random(seed).sample(range(n), k))


def reward_means(rewards: Sequence[RewardBreakdown]) -> dict[str, float]:
    n = max(len(rewards), 1)
    return {f"reward/{k}": sum(getattr(r, k) for r in rewards) / n for k in REWARD_TERMS}


EVAL_BATCH = 64
"""Held-out examples per generate call: a progress line after each."""


def evaluate(cfg: Config, model_path: str, examples_path: str | Path, out_dir: str | Path, label: str,
             local: bool) -> EvalReport:
    """Needs Ray started (or `local`); builds its own engines and reward pool and shuts them down."""
    from shop_r1.data.encode import encode_prompts
    from shop_r1.data.examples import load_rl_examples
    from shop_r1.models.tokenizer import load_tokenizer

    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    examples = load_rl_examples(examples_path)
    if cfg.eval.max_examples:
        examples = examples[: cfg.eval.max_examples]
    context = max_model_len(cfg, model_path)
    prompts = encode_prompts(load_tokenizer(model_path), examples,
                             max_prompt_tokens=context - cfg.eval.max_new_tokens)
    spec = SamplingSpec(n=1, temperature=cfg.eval.temperature, max_new_tokens=cfg.eval.max_new_tokens,
                        top_k_logprobs=cfg.rollout.top_k_logprobs, seed=cfg.seed)
    print(f"[eval {label}] {len(prompts)} examples: starting the engines and the reward pool", flush=True)
    engines = EngineGroup(model_path, cfg.rollout, context, cfg.seed, local=local)
    pool = RewardPool(cfg.reward, cfg.reward_pool, local=local)
    try:
        scored = []
        begin = time.perf_counter()
        for first in range(0, len(prompts), EVAL_BATCH):  # greedy and seeded per request: batches change nothing
            part = engines.generate_scored(prompts[first:first + EVAL_BATCH], spec, pool).scored
            scored += [dataclasses.replace(x, generation=dataclasses.replace(
                x.generation, prompt_index=first + x.generation.prompt_index)) for x in part]
            done, elapsed = len(scored), time.perf_counter() - begin
            eta = elapsed / done * (len(prompts) - done)
            print(f"[eval {label} {done:>4d}/{len(prompts)} {elapsed:6.0f}s ETA {int(eta // 60)}m{int(eta % 60):02d}s]",
                  flush=True)
        samples = _headroom_samples(cfg, engines, prompts, label) if cfg.eval.headroom_examples else None
    finally:
        engines.shutdown()
        pool.shutdown()
    headroom = _write_headroom(scored, samples, cfg.rollout.temperature, out) if samples is not None else None
    return _write_report(scored, out, label, time.perf_counter() - start, headroom)


def _headroom_samples(cfg: Config, engines: EngineGroup, prompts: list, label: str) -> dict[int, list[str]]:
    """rollout.group_size samples at rollout.temperature of the `headroom_indices` examples, by example index."""
    rows = headroom_indices(len(prompts), cfg.eval.headroom_examples, cfg.seed)
    spec = SamplingSpec(n=cfg.rollout.group_size, temperature=cfg.rollout.temperature,
                        max_new_tokens=cfg.eval.max_new_tokens, top_k_logprobs=0, seed=cfg.seed + 1)
    begin, out = time.perf_counter(), {}
    for first in range(0, len(rows), EVAL_BATCH // 4):
        part = rows[first:first + EVAL_BATCH // 4]
        gens = engines.generate([prompts[i].token_ids for i in part], spec)
        out.update({i: [c.text for c in g.completions] for i, g in zip(part, gens)})
    print(f"[eval {label}] headroom: {cfg.rollout.group_size} samples at temperature {cfg.rollout.temperature:g} on "
          f"{len(rows)} examples in {time.perf_counter() - begin:.0f}s", flush=True)
    return out


def _write_headroom(scored: Sequence[ScoredGeneration], samples: dict[int, list[str]], temperature: float,
                    out: Path) -> Headroom:
    rows = sorted(samples)
    with (out / "samples.jsonl").open("w", encoding="utf-8") as f:
        for i in rows:
            f.write(json.dumps({"example_id": scored[i].prompt.example_id, "samples": samples[i]},
                               ensure_ascii=False) + "\n")
    headroom = compute_headroom([scored[i].generation.completions[0].text for i in rows], [samples[i] for i in rows],
                                [scored[i].prompt.target for i in rows], temperature)
    (out / "headroom.json").write_text(json.dumps(headroom.to_dict(), indent=2))
    return headroom


def _write_report(scored: Sequence[ScoredGeneration], out: Path, label: str, seconds: float,
                  headroom: Headroom | None = None) -> EvalReport:
    responses = [s.generation.completions[0].text for s in scored]
    targets = [s.prompt.target for s in scored]
    rewards = [s.rewards[0] for s in scored]
    preds_path = out / "predictions.jsonl"
    with preds_path.open("w", encoding="utf-8") as f:
        for s, response, reward in zip(scored, responses, rewards):
            f.write(json.dumps({"example_id": s.prompt.example_id, "response": response,
                                "target": s.prompt.target.to_dict(), "reward": reward.to_dict(),
                                "reward_error": reward.error}, ensure_ascii=False) + "\n")
    metrics = compute_metrics(responses, targets)
    means = reward_means(rewards)
    failures = sum(r.error is not None for r in rewards)
    metrics_path = out / "metrics.json"
    metrics_path.write_text(json.dumps({"label": label, **metrics.to_dict(), **means,
                                        "reward/num_failed": failures, "seconds": seconds}, indent=2))
    table = format_metrics_table(metrics, title=label)
    if headroom is not None:
        table += "\n\n" + format_headroom([(label, headroom)])
    (out / "metrics.txt").write_text(table + "\n")
    return EvalReport(label, metrics, means, failures, str(preds_path), str(metrics_path), seconds, headroom)


def load_report(out_dir: str | Path) -> EvalReport:
    """The report `evaluate` wrote into `out_dir`, read back (a finished evaluation the pipeline skips on a re-run):
    the metrics recomputed from predictions.jsonl, the reward means and timing from metrics.json."""
    from shop_r1.metrics import load_predictions_jsonl

    out = Path(out_dir)
    saved = json.loads((out / "metrics.json").read_text())
    responses, targets = load_predictions_jsonl(out / "predictions.jsonl")
    metrics = compute_metrics(responses, targets)
    if metrics.n != saved.get("n"):
        raise ValueError(f"{out}: predictions.jsonl holds {metrics.n} predictions, metrics.json says {saved.get('n')}"
                         ": the evaluation was cut short; remove the folder to evaluate again")
    means = {f"reward/{k}": saved[f"reward/{k}"] for k in REWARD_TERMS}
    headroom_path = out / "headroom.json"
    headroom = Headroom.from_dict(json.loads(headroom_path.read_text())) if headroom_path.exists() else None
    return EvalReport(saved["label"], metrics, means, int(saved["reward/num_failed"]), str(out / "predictions.jsonl"),
                      str(out / "metrics.json"), float(saved["seconds"]), headroom)


def headroom_table(reports: Sequence[EvalReport]) -> str:
    """The headroom lines of the reports that have one ("" when none does)."""
    return format_headroom([(r.label, r.headroom) for r in reports if r.headroom is not None])


def comparison_rows(reports: Sequence[EvalReport], baseline: str = "SFT",
                    train_examples_path: str | Path | None = None,
                    test_examples_path: str | Path | None = None) -> Comparison:
    """The evaluation runs (one row per report, from its predictions.jsonl) and, given the example files, the three
    trivial baselines on the same held-out examples (`shop_r1.baselines`: fitted on `train_examples_path`, which is
    best the SFT file `sft_train.jsonl`, holding every training step before balancing). Session-resampled intervals,
    paired differences against the `baseline` row and against the best baseline (`shop_r1.comparison`).
    `.to_dict()` is what results.json holds."""
    from shop_r1.comparison import Setting, baseline_settings, compare
    from shop_r1.metrics import load_predictions

    if (train_examples_path is None) != (test_examples_path is None):
        raise ValueError("comparison_rows: give both train_examples_path and test_examples_path, or neither")
    settings = [Setting(r.label, "model", load_predictions(r.predictions_path), r.reward_means.get("reward/total"),
                        name=Path(r.predictions_path).parent.name) for r in reports]
    if train_examples_path is not None and test_examples_path is not None:
        settings += baseline_settings(train_examples_path, test_examples_path)
    return compare(settings, reference=baseline)


def comparison_table(reports: Sequence[EvalReport], baseline: str = "SFT",
                     train_examples_path: str | Path | None = None,
                     test_examples_path: str | Path | None = None) -> str:
    """A Table 2-style comparison of evaluation runs (one row per setting) and, given the example files, the trivial
    baselines: `format_comparison(comparison_rows(...))`."""
    from shop_r1.comparison import format_comparison

    return format_comparison(comparison_rows(reports, baseline, train_examples_path, test_examples_path))
