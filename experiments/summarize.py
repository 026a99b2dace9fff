"""A suite's results: metrics with 95% bootstrap intervals, paired differences against SFT, the paper side by side,
and plots of the GRPO runs (reward, action-type mix of the rollouts over training). Reads only the workspace's files,
so it can be re-run on a finished (or half-finished) workspace: `python experiments/summarize.py SUITE`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shop_r1.bootstrap import bootstrap_intervals, paired_difference  # noqa: E402
from shop_r1.metrics import compute_metrics, load_predictions_jsonl  # noqa: E402

MACHINE_NOTE = "2-core x86_64 CPU (AVX2), no GPU"


def _machine_name() -> str:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import machine  # benchmarks/common.py: the same name the benchmark results use

    return machine()["name"]


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _row_result(ws: Path, name: str, sft_preds: tuple | None) -> dict[str, Any] | None:
    preds = ws / "eval" / name / "predictions.jsonl"
    if not preds.exists():
        return None
    responses, targets = load_predictions_jsonl(preds)
    m = compute_metrics(responses, targets)
    out: dict[str, Any] = {"metrics": m.to_dict(),
                           "intervals": {k: v.to_dict() for k, v in bootstrap_intervals(responses, targets).items()}}
    if sft_preds is not None and name != "sft":
        out["minus_sft"] = {k: v.to_dict() for k, v in paired_difference(sft_preds[0], responses, targets).items()}
    done = ws / "rl" / name / "done.json"
    if done.exists():
        out["rl"] = json.loads(done.read_text())
    return out


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


def _table(suite_name: str, rows: list, results: dict[str, Any], workspace: str) -> str:
    head = ("| Setting | Exact match % [95% CI] | Type acc. % [95% CI] | Type macro-F1 % [95% CI] | "
            "Exact vs SFT (paired, pp) | n | Paper: exact / type acc. / F1 % |")
    from experiments.run import PAPER

    lines = [head, "|" + "---|" * 7]
    for r in rows:
        res = results.get(r.name)
        paper_key = f"{workspace}/{r.name}" if workspace and f"{workspace}/{r.name}" in PAPER else r.name
        paper = PAPER.get(paper_key)
        paper_s = " / ".join(f"{x:.2f}" for x in paper) if paper else "-"
        if res is None:
            lines.append(f"| {r.label} | (not run yet) | | | | | {paper_s} |")
            continue
        iv = res["intervals"]
        cell = lambda k, iv=iv: f"{_pct(iv[k]['value'])} [{_pct(iv[k]['low'])}, {_pct(iv[k]['high'])}]"  # noqa: E731
        diff = res.get("minus_sft", {}).get("exact_match")
        diff_s = f"{100 * diff['value']:+.2f} [{100 * diff['low']:+.2f}, {100 * diff['high']:+.2f}]" if diff else "-"
        lines.append(f"| {r.label} | {cell('exact_match')} | {cell('type_accuracy')} | {cell('type_macro_f1')} | "
                     f"{diff_s} | {res['metrics']['n']} | {paper_s} |")
    return "\n".join(lines)


def summarize(suite_name: str, suite: Any, ws: Path, results_root: Path) -> Path:
    from experiments.run import ALIASES, Row

    out = results_root / _machine_name() / suite_name
    out.mkdir(parents=True, exist_ok=True)
    rows = [Row(ALIASES.get(r.name, r.name), r.label, r.rl_overrides, r.model) for r in suite.rows]
    sft_path = ws / "eval" / "sft" / "predictions.jsonl"
    sft_preds = load_predictions_jsonl(sft_path) if sft_path.exists() else None
    results = {r.name: res for r in rows if (res := _row_result(ws, r.name, sft_preds)) is not None}
    stats = json.loads((ws / "data" / "stats.json").read_text()) if (ws / "data" / "stats.json").exists() else {}
    times = json.loads((ws / "stage_seconds.json").read_text()) if (ws / "stage_seconds.json").exists() else {}
    config = (ws / "config.yaml").read_text() if (ws / "config.yaml").exists() else ""
    payload = {"suite": suite_name, "machine": MACHINE_NOTE, "rows": {r.name: r.label for r in rows},
               "results": results, "stage_seconds": times,
               "data": {k: stats.get(k) for k in ("rl_train", "rl_test", "num_sft_train", "num_rl_over_budget",
                                                  "num_rl_test_over_budget")}}
    (out / "results.json").write_text(json.dumps(payload, indent=2))
    (out / "config.yaml").write_text(config)
    table = _table(suite_name, rows, results, suite.workspace)
    plots = _plots(ws, rows, out)
    if suite_name == "fig2":
        plots += _temperature_plot(rows, results, out)
    test = stats.get("rl_test") or {}
    md = [f"# {suite_name} on {MACHINE_NOTE}", "",
          f"Held-out: {test.get('num_examples', '?')} RL examples of unseen sessions "
          f"({stats.get('num_rl_test_over_budget', '?')} dropped for length); greedy decoding. "
          "Intervals: 95% percentile bootstrap (2,000 resamples); 'vs SFT' is the paired bootstrap of the "
          "difference in exact match on the same examples.", "", table, "",
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


if __name__ == "__main__":
    import argparse

    from experiments.run import SUITES

    parser = argparse.ArgumentParser()
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--root", default=str(ROOT / "runs" / "experiments"))
    parser.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    args = parser.parse_args()
    s = SUITES[args.suite]
    print(summarize(args.suite, s, Path(args.root) / s.workspace if s.workspace else Path(args.root),
                    Path(args.results)))
