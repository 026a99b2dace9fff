"""A suite's results: every row and the trivial baselines (always terminate, majority type, the visible rule; fitted
on the workspace's training file, scored on its held-out examples) with 95% session-bootstrap intervals, kappa,
per-type exact, the predicted type mix, paired differences against SFT and the best baseline, the paper side by side,
and plots of the GRPO runs (reward, action-type mix of the rollouts over training) and of exact match vs the share of
predicted terminates. Each row's predictions are written beside the table as `predictions/<row>.jsonl.gz`, so every
number can be recomputed. Reads only the workspace's files, so it can be re-run on a finished (or half-finished)
workspace: `python experiments/summarize.py SUITE`; `--plot-all` plots every row of every committed table."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shop_r1.baselines import training_file  # noqa: E402
from shop_r1.comparison import (  # noqa: E402
    Comparison,
    Setting,
    baseline_settings,
    compare,
    comparison_markdown,
    plot_exact_vs_terminate,
    plot_points,
)
from shop_r1.metrics import load_predictions, write_predictions  # noqa: E402

MACHINE_NOTE = "2-core x86_64 CPU (AVX2), no GPU"


def _machine_name() -> str:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import machine  # benchmarks/common.py: the same name the benchmark results use

    return machine()["name"]


def _settings(ws: Path, rows: list) -> list[Setting]:
    """The rows evaluated so far and, when the workspace has its data, the baselines on the held-out examples."""
    settings = [Setting(r.label, "model", load_predictions(path), name=r.name) for r in rows
                if (path := ws / "eval" / r.name / "predictions.jsonl").exists()]
    test, train = ws / "data" / "rl_test.jsonl", training_file(ws / "data")
    if settings and test.exists() and train is not None:
        settings += baseline_settings(train, test)
    return settings


def _row_result(ws: Path, row: Any, c: Comparison) -> dict[str, Any]:
    """results.json's entry of one row (the keys of the earlier tables kept: metrics, intervals, minus_sft)."""
    r = c.row(row.label)
    out: dict[str, Any] = {"metrics": r.metrics.to_dict(),
                           "intervals": {k: v.to_dict() for k, v in r.intervals.items()}}
    if r.vs_reference is not None:
        out["minus_sft"] = {k: v.to_dict() for k, v in r.vs_reference.items()}
    if r.vs_best_baseline is not None:
        out["minus_best_baseline"] = {k: v.to_dict() for k, v in r.vs_best_baseline.items()}
        out["best_baseline"] = c.best_baseline
    done = ws / "rl" / row.name / "done.json"
    if done.exists():
        out["rl"] = json.loads(done.read_text())
    return out


def _write_predictions(settings: list[Setting], out: Path) -> list[str]:
    """predictions/<row>.jsonl.gz (example_id, response, target) for every row of the table, models and baselines,
    on the examples of the table (the first row's, in its order)."""
    ids = settings[0].predictions.example_ids
    return [write_predictions(s.predictions.select(ids), out / "predictions" / f"{s.name}.jsonl.gz").name
            for s in settings]


def _rl_log(ws: Path, name: str) -> list[dict]:
    path = ws / "rl" / name / "metrics_grpo.jsonl"
    if not path.exists():
        return []
    from shop_r1.report import load_metrics

    return list(load_metrics(path).records)


def _smooth(values: list[float], k: int = 5) -> list[float]:
    return [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1]) for i in range(len(values))]


def _save(fig: Any, axes: Any, path: Path, legend_size: int) -> str:
    """Grid and legend on every axis, then the PNG written and the figure closed; returns the file name."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _plots(ws: Path, rows: list, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = {r.label: _rl_log(ws, r.name) for r in rows if r.rl_overrides is not None}
    logs = {k: v for k, v in logs.items() if v}
    made = []
    if not logs:
        return made
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for label, log in logs.items():
        steps = [r["step"] for r in log]
        axes[0].plot(steps, _smooth([r["reward/total"] for r in log]), label=label)
        axes[1].plot(steps, _smooth([r["reward/format"] + r["reward/action_type"] + r["reward/attribute"]
                                     for r in log]), label=label)
    axes[0].set_title("mean total reward of the rollouts (5-step mean)")
    axes[1].set_title("format + type + attribute reward (5-step mean)")
    for ax in axes:
        ax.set_xlabel("GRPO step")
    made.append(_save(fig, axes, out / "reward.png", legend_size=7))
    kinds = ("click", "type_and_submit", "terminate", "invalid")
    fig, axes = plt.subplots(1, len(logs), figsize=(4 * len(logs), 3.5), squeeze=False)
    for ax, (label, log) in zip(axes[0], logs.items()):
        steps = [r["step"] for r in log]
        ax.stackplot(steps, *[_smooth([r[f"rollout/type_{k}"] for r in log]) for k in kinds], labels=kinds,
                     alpha=0.85)
        ax.set_title(label, fontsize=9)
        ax.set_ylim(0, 1)
        ax.set_xlabel("GRPO step")
    axes[0][0].set_ylabel("share of rollouts")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "action_mix.png", dpi=110)
    plt.close(fig)
    made.append("action_mix.png")
    return made


def _temperature_plot(rows: list, results: dict[str, Any], out: Path) -> list[str]:
    """Figure 2's axes: held-out exact match, type accuracy and type macro-F1 (95% CIs) against the RL sampling
    temperature, the SFT model as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = []
    for r in rows:
        temps = [o.split("=", 1)[1] for o in (r.rl_overrides or ()) if o.startswith("rollout.temperature=")]
        if r.name == "shop_r1":
            temps = ["0.6"]
        if temps and r.name in results:
            points.append((float(temps[0]), results[r.name]["intervals"]))
    if not points:
        return []
    points.sort()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key, label in (("exact_match", "exact match"), ("type_accuracy", "type accuracy"),
                       ("type_macro_f1", "type macro-F1")):
        xs = [t for t, _ in points]
        ys = [100 * iv[key]["value"] for _, iv in points]
        err = [[100 * (iv[key]["value"] - iv[key]["low"]) for _, iv in points],
               [100 * (iv[key]["high"] - iv[key]["value"]) for _, iv in points]]
        line = ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
        if "sft" in results:
            ax.axhline(100 * results["sft"]["intervals"][key]["value"], ls="--", lw=0.8,
                       color=line[0].get_color())
    ax.set_xlabel("RL sampling temperature")
    ax.set_ylabel("% on the held-out set (95% CI)")
    ax.set_title("Shop-R1 vs RL sampling temperature (dashed: SFT)")
    return [_save(fig, [ax], out / "temperature.png", legend_size=8)]


def _paper(rows: list, workspace: str) -> dict[str, str]:
    """The paper's numbers per row label (exact / type acc. / F1 %)."""
    from experiments.run import PAPER

    out = {}
    for r in rows:
        key = f"{workspace}/{r.name}" if workspace and f"{workspace}/{r.name}" in PAPER else r.name
        if key in PAPER:
            out[r.label] = " / ".join(f"{x:.2f}" for x in PAPER[key])
    return out


def _table(rows: list, c: Comparison | None, workspace: str) -> list[str]:
    """The comparison (models, then baselines) as Markdown, the paper beside it; rows not evaluated yet listed."""
    paper = _paper(rows, workspace)
    done = {r.label for r in c.rows} if c is not None else set()
    missing = [f"- {r.label}: not run yet (paper: {paper.get(r.label, '-')})" for r in rows if r.label not in done]
    return [*(comparison_markdown(c, paper) if c is not None else []), *missing]


def summarize(suite_name: str, suite: Any, ws: Path, results_root: Path) -> Path:
    from experiments.run import ALIASES, Row

    out = results_root / _machine_name() / suite_name
    out.mkdir(parents=True, exist_ok=True)
    rows = [Row(ALIASES.get(r.name, r.name), r.label, r.rl_overrides, r.model) for r in suite.rows]
    settings = _settings(ws, rows)
    c = compare(settings, reference="SFT") if settings else None
    results = {r.name: _row_result(ws, r, c) for r in rows if c is not None and r.label in {x.label for x in c.rows}}
    stats = json.loads((ws / "data" / "stats.json").read_text()) if (ws / "data" / "stats.json").exists() else {}
    times = json.loads((ws / "stage_seconds.json").read_text()) if (ws / "stage_seconds.json").exists() else {}
    config = (ws / "config.yaml").read_text() if (ws / "config.yaml").exists() else ""
    payload = {"suite": suite_name, "machine": MACHINE_NOTE, "rows": {r.name: r.label for r in rows},
               "results": results, "comparison": c.to_dict() if c is not None else None, "stage_seconds": times,
               "data": {k: stats.get(k) for k in ("rl_train", "rl_test", "num_sft_train", "num_rl_over_budget",
                                                  "num_rl_test_over_budget")}}
    (out / "results.json").write_text(json.dumps(payload, indent=2))
    (out / "config.yaml").write_text(config)
    written = _write_predictions(settings, out) if settings else []
    plots = _plots(ws, rows, out)
    if suite_name == "fig2":
        plots += _temperature_plot(rows, results, out)
    if c is not None and (p := plot_exact_vs_terminate(plot_points(suite_name, c), out / "exact_vs_terminate.png")):
        plots.append(p.name)
    test = stats.get("rl_test") or {}
    md = [f"# {suite_name} on {MACHINE_NOTE}", "",
          f"Held-out: {test.get('num_examples', '?')} RL examples of unseen sessions "
          f"({stats.get('num_rl_test_over_budget', '?')} dropped for length); greedy decoding. Baselines (in italics) "
          f"are fitted on the workspace's training split and scored on the same held-out examples.", "",
          *_table(rows, c, suite.workspace), "",
          f"Per-example predictions behind every row: `predictions/` ({', '.join(written) or 'none'}).", "",
          "Stage times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()), ""]
    md += [f"![{p}]({p})" for p in plots]
    (out / "table.md").write_text("\n".join(md) + "\n")
    for name in ("rollouts.jsonl",):  # a sample of the shop_r1 rollouts for inspection (first 2 steps)
        src = ws / "rl" / "shop_r1" / name
        if src.exists():
            lines = [ln for ln in src.read_text().splitlines() if json.loads(ln)["step"] <= 2]
            (out / "shop_r1_rollouts_first_steps.jsonl").write_text("\n".join(lines) + "\n")
    shutil.copy(ws / "data" / "stats.json", out / "data_stats.json") if (ws / "data" / "stats.json").exists() else None
    return out


def plot_all(machine_dir: Path) -> Path | None:
    """Exact match vs predicted terminates for every row of every table under `machine_dir` (each suite's
    results.json with a `comparison`; older files without one are skipped and named)."""
    points, skipped = [], []
    for path in sorted(machine_dir.glob("*/results.json")):
        comparison = json.loads(path.read_text()).get("comparison")
        if comparison:
            points += plot_points(path.parent.name, comparison)
        else:
            skipped.append(path.parent.name)
    if skipped:
        print(f"plot_all: no comparison (re-run summarize) in: {', '.join(skipped)}", flush=True)
    return plot_exact_vs_terminate(points, machine_dir / "exact_vs_terminate.png",
                                   title="Every row of every table: exact match vs predicted terminates")


if __name__ == "__main__":
    import argparse

    from experiments.run import SUITES

    parser = argparse.ArgumentParser()
    parser.add_argument("suite", nargs="?", choices=sorted(SUITES))
    parser.add_argument("--root", default=str(ROOT / "runs" / "experiments"))
    parser.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    parser.add_argument("--plot-all", action="store_true", help="plot every row of every table of this machine")
    args = parser.parse_args()
    if args.suite:
        s = SUITES[args.suite]
        print(summarize(args.suite, s, Path(args.root) / s.workspace if s.workspace else Path(args.root),
                        Path(args.results)))
    if args.plot_all:
        print(plot_all(Path(args.results) / _machine_name()))
    if not args.suite and not args.plot_all:
        parser.error("give a suite, --plot-all, or both")
