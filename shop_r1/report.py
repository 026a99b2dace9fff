"""`shop-r1 report RUN_DIR`: a run's metrics JSONL files -> a Markdown summary and PNG plots.

Reads what the stages wrote into the run folder: `metrics_grpo.jsonl` (one record per GRPO step), `metrics_sft.jsonl`,
and `eval/*/metrics.json`. Writes `RUN_DIR/report/report.md` and, per figure, a PNG beside it: reward terms over
steps, the rollouts' action-type mix (a collapse onto `terminate` shows as one band filling the plot), KL, time per
stage, and the SFT loss. Where the evaluations' `predictions.jsonl` are there too, the table is redone from them with
the trivial baselines beside the models (`shop_r1.comparison`; baselines need `data/rl_test.jsonl` and a training
file): session-resampled intervals, kappa, per-type exact, predicted mix, paired differences against SFT and the best
baseline, written also as `comparison.json`, and the plot of exact match vs the share of predicted terminates.
A run killed mid-write may leave a torn last line: it is skipped and reported; a malformed line anywhere else is an
error naming FILE:LINE.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shop_r1.comparison import Comparison
from shop_r1.metrics import format_mix
from shop_r1.rollout.metrics import REWARD_TERMS
from shop_r1.tracking import scan_metrics
from shop_r1.types import ACTION_TYPES

STAGES = ("rollout", "reward", "advantages", "update", "weight_sync", "other")
"""`timing/*` keys of a GRPO step that partition `timing/step` (advantages are counted in `other`)."""


@dataclass(frozen=True)
class MetricsLog:
    path: Path
    records: tuple[dict, ...]
    torn_last_line: bool = False

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the records that carry `key`."""
        pairs = [(int(r["step"]), float(r[key])) for r in self.records if key in r]
        return [s for s, _ in pairs], [v for _, v in pairs]

    def keys(self) -> set[str]:
        return {k for r in self.records for k in r}


def load_metrics(path: str | Path) -> MetricsLog:
    """One tracker JSONL file, one record per step (the last one logged). A line that is not an object with an
    integer `step` is skipped with a warning naming FILE:LINE (`shop_r1.tracking.scan_metrics`)."""
    read = scan_metrics(path)
    return MetricsLog(read.path, read.records, read.torn_last_line)


@dataclass(frozen=True)
class Report:
    markdown_path: Path
    plots: tuple[Path, ...]
    notes: tuple[str, ...] = field(default=())


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _f(v: float, digits: int = 3) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def eval_rows(run_dir: Path) -> list[dict]:
    """`eval/*/metrics.json` in pipeline order (zero-shot, SFT, Shop-R1), then any others by name; each with `dir`,
    the name of its folder under eval/."""
    order = {"zero_shot": 0, "sft": 1, "shop_r1": 2}
    paths = sorted((run_dir / "eval").glob("*/metrics.json"), key=lambda p: (order.get(p.parent.name, 9), p))
    rows = []
    for p in paths:
        try:
            rows.append({**json.loads(p.read_text(encoding="utf-8")), "dir": p.parent.name})
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not JSON ({e.msg})") from None
    return rows


def eval_table(rows: Sequence[dict]) -> list[str]:
    """From the metrics.json files alone (no baselines, no intervals); `–` where an older file lacks a key."""
    lines = ["| Setting | Exact Acc. | Type Acc. | Type F1 | kappa | Exact non-term. | Predicted mix c/t/x/? % | "
             "Reward | n |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        nt = r.get("exact_match_non_terminate")
        lines.append(f"| {r.get('label', '?')} | {100 * r['exact_match']:.2f}% | {100 * r['type_accuracy']:.2f}% | "
                     f"{100 * r['type_macro_f1']:.2f}% | {_f(r.get('type_kappa', float('nan')))} | "
                     f"{'–' if nt is None else f'{100 * nt:.2f}%'} | "
                     f"{format_mix(r.get('predicted_mix')).split(' ', 1)[-1].replace('-', '–')} | "
                     f"{_f(r.get('reward/total', float('nan')))} | {r['n']} |")
    return lines


@dataclass(frozen=True)
class BaselineSection:
    markdown: tuple[str, ...]
    comparison: Comparison
    plot: Path | None


def baseline_section(run_dir: Path, rows: Sequence[dict], out: Path) -> BaselineSection | None:
    """The comparison with baselines, from `eval/*/predictions.jsonl` (the rows of `eval_rows`, in their order) and
    `data/`; None when no evaluation left its predictions."""
    from shop_r1.baselines import training_file
    from shop_r1.comparison import Setting, baseline_settings, compare, comparison_markdown, plot_exact_vs_terminate
    from shop_r1.comparison import plot_points as points_of
    from shop_r1.metrics import load_predictions

    settings = []
    for r in rows:
        path = run_dir / "eval" / r["dir"] / "predictions.jsonl"
        if path.exists():
            settings.append(Setting(r.get("label", r["dir"]), "model", load_predictions(path), r.get("reward/total"),
                                    name=r["dir"]))
    if not settings:
        return None
    test, train = _held_out_file(run_dir / "data", settings[0].predictions.example_ids), training_file(run_dir / "data")
    notes = []
    if test is not None and train is not None:
        settings += baseline_settings(train, test)
        notes.append(f"Baselines fitted on `data/{train.name}`, scored on `data/{test.name}`.")
    else:
        notes.append("No baselines: the run folder has no data/rl_test.jsonl or rl_val.jsonl holding the evaluated "
                     "examples, with a training file beside it.")
    c = compare(settings)
    (out / "comparison.json").write_text(json.dumps(c.to_dict(), indent=2))
    plot = plot_exact_vs_terminate(points_of(run_dir.resolve().name, c), out / "exact_vs_terminate.png")
    md = ["## Against the baselines", "", *notes, "", *comparison_markdown(c), ""]
    if plot is not None:
        md += [f"![{plot.stem}]({plot.name})", ""]
    return BaselineSection(tuple(md), c, plot)


def _held_out_file(data_dir: Path, example_ids: Sequence[str]) -> Path | None:
    """The held-out examples the evaluations read: the test split, or the validation split (`eval.split=val`)."""
    from shop_r1.data.jsonl import read_jsonl_objects

    wanted = set(example_ids)
    for name in ("rl_test.jsonl", "rl_val.jsonl"):
        path = data_dir / name
        if path.exists() and wanted <= {obj.get("example_id") for _, obj in read_jsonl_objects(path)}:
            return path
    return None


def plugin_reward_keys(log: MetricsLog) -> list[str]:
    """The plug-in reward functions' `reward/<name>` and `reward/<name>_applied` (shop_r1/reward/functions.py)."""
    known = {f"reward/{t}" for t in REWARD_TERMS}
    return sorted(k for k in log.keys() if k.startswith("reward/") and k not in known
                  and not k.startswith("reward/num_failed"))


def grpo_summary(log: MetricsLog) -> list[str]:
    steps, _ = log.series("reward/total")
    lines = [f"{len(log.records)} GRPO steps logged (steps {steps[0]}–{steps[-1]})." if steps else
             "No GRPO step logged."]
    if not steps:
        return lines
    lines += ["", "| metric | first step | last step | mean |", "|---|---:|---:|---:|"]
    keys = [f"reward/{t}" for t in REWARD_TERMS] + plugin_reward_keys(log) + [
        f"rollout/type_{t}" for t in (*ACTION_TYPES, "invalid")] + [
        "rollout/response_tokens_mean", "train/kl", "train/clip_fraction", "train/zero_signal_groups",
        "throughput/generated_tokens_per_s"]
    for key in keys:
        _, values = log.series(key)
        if values:
            lines.append(f"| `{key}` | {_f(values[0])} | {_f(values[-1])} | {_f(_mean(values))} |")
    step_s = log.series("timing/step")[1]
    if step_s:
        total = sum(step_s)
        lines += ["", "Time per stage (all steps):", "", "| stage | seconds | share of step time |", "|---|---:|---:|"]
        for stage in STAGES:
            s = sum(log.series(f"timing/{stage}")[1])
            lines.append(f"| {stage} | {s:.1f} | {100 * s / total:.1f}% |")
        lines.append(f"| **step** | {total:.1f} | 100% |")
    return lines


def _plot(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list[int], list[float]]],
          stacked: bool = False) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {k: v for k, v in series.items() if v[0]}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    if stacked:
        steps = next(iter(series.values()))[0]
        ax.stackplot(steps, *[v for _, v in series.values()], labels=list(series), alpha=0.85)
        ax.set_ylim(0, max(1.0, max(sum(col) for col in zip(*[v for _, v in series.values()]))))
    else:
        for name, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def grpo_plots(log: MetricsLog, out: Path) -> list[Path]:
    made = [
        _plot(out / "reward_terms.png", "Reward terms (mean over rollouts)", "GRPO step", "reward",
              {t: log.series(f"reward/{t}") for t in REWARD_TERMS}),
        _plot(out / "action_mix.png", "Action-type mix of rollouts", "GRPO step", "fraction of samples",
              {t: log.series(f"rollout/type_{t}") for t in (*ACTION_TYPES, "invalid")}, stacked=True),
        _plot(out / "kl.png", "KL(policy || reference), k3 estimate", "GRPO step", "KL",
              {"train/kl": log.series("train/kl")}),
        _plot(out / "timing.png", "Time per stage", "GRPO step", "seconds",
              {s: log.series(f"timing/{s}") for s in STAGES}, stacked=True),
        # rl.val_every: greedy answers on a fixed validation subset while training; a drift to a constant answer
        # shows as pred_terminate (or another share) running away while exact and kappa stall.
        _plot(out / "validation.png", "Validation subset during GRPO (greedy)", "GRPO step", "share",
              {k: log.series(f"val/{k}") for k in ("exact", "kappa", "exact_non_terminate", "pred_terminate")}),
    ]
    return [p for p in made if p is not None]


def sample_rollouts(path: Path, per_step: int = 2, chars: int = 300) -> list[str]:
    """A few samples of the first and the last logged GRPO step (the first group of each), with their rewards."""
    if not path.exists():
        return []
    groups = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            groups.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line of a killed run
    if not groups:
        return []
    first, last = groups[0], groups[-1]
    md = ["## Sample rollouts", "",
          f"From `{path.name}` (every sample of every step is there): the first group of step {first['step']} and "
          f"of step {last['step']}.", ""]
    for g in ([first, last] if last is not first else [first]):
        md.append(f"**Step {g['step']}, example `{g['example_id']}`**")
        md.append("")
        for x in g["samples"][:per_step]:
            r = x["reward"]
            text = x["text"] if len(x["text"]) <= chars else x["text"][:chars] + " ..."
            md += [f"- total {r['total']:.3f} (format {r['format']:g}, type {r['action_type']:g}, attribute "
                   f"{r['attribute']:g}, value {r['value']:g}, s(r) {r['self_certainty']:.3f}), advantage "
                   f"{x['advantage']:+.3f}, policy version {x['policy_version']}", "",
                   "  ```", "  " + text.replace("\n", "\n  "), "  ```"]
        md.append("")
    return md


def make_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Report:
    """Write the report of `run_dir` (default into RUN_DIR/report). Needs at least one metrics file or eval."""
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"report: no run folder at {run}")
    out = Path(out_dir) if out_dir is not None else run / "report"
    grpo_path, sft_path = run / "metrics_grpo.jsonl", run / "metrics_sft.jsonl"
    rows = eval_rows(run)
    if not grpo_path.exists() and not sft_path.exists() and not rows:
        raise FileNotFoundError(f"report: {run} has no metrics_grpo.jsonl, metrics_sft.jsonl or eval/*/metrics.json")
    out.mkdir(parents=True, exist_ok=True)  # after the check: an empty folder is left as it was

    md = [f"# shop-r1 run report: `{run.resolve().name}`", ""]
    plots: list[Path] = []
    notes: list[str] = []
    if rows:
        md += ["## Evaluation (Table 2 style)", "", *eval_table(rows), ""]
        section = baseline_section(run, rows, out)
        if section is not None:
            md += list(section.markdown)
            plots += [section.plot] if section.plot is not None else []
    if grpo_path.exists():
        grpo = load_metrics(grpo_path)
        if grpo.torn_last_line:
            notes.append(f"{grpo_path}: torn last line skipped (run killed mid-write?)")
        md += ["## GRPO", "", *grpo_summary(grpo), ""]
        for p in grpo_plots(grpo, out):
            plots.append(p)
            md.append(f"![{p.stem}]({p.name})")
        md.append("")
    if sft_path.exists():
        sft = load_metrics(sft_path)
        if sft.torn_last_line:
            notes.append(f"{sft_path}: torn last line skipped (run killed mid-write?)")
        steps, losses = sft.series("sft/loss")
        if losses:
            md += ["## SFT cold start", "", f"{len(losses)} steps; loss {losses[0]:.4f} -> {losses[-1]:.4f}.", ""]
            p = _plot(out / "sft_loss.png", "SFT loss", "SFT step", "token-mean NLL", {"sft/loss": (steps, losses)})
            if p is not None:
                plots.append(p)
                md += [f"![{p.stem}]({p.name})", ""]
    md += sample_rollouts(run / "rollouts.jsonl")
    times_path = run / "stage_seconds.json"
    if times_path.exists():
        times = json.loads(times_path.read_text())
        md += ["## Time per stage", "", "| stage | seconds |", "|---|---|",
               *[f"| {k} | {v:.0f} |" for k, v in times.items()], f"| total | {sum(times.values()):.0f} |", ""]
    if notes:
        md += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    path = out / "report.md"
    path.write_text("\n".join(md), encoding="utf-8")
    return Report(path, tuple(plots), tuple(notes))
