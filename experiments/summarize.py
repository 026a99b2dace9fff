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
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.same_config import check_carry  # noqa: E402
from experiments.suites import (  # noqa: E402
    ALIASES,
    PAPER,
    SUITES,
    V2_SEEDS,
    V2_SUITES,
    Row,
    Suite,
    seed_workspace,
    v2_suite,
)
from shop_r1.baselines import training_file  # noqa: E402
from shop_r1.comparison import (  # noqa: E402
    Comparison,
    ComparisonRow,
    Setting,
    baseline_settings,
    compare,
    comparison_markdown,
    plot_exact_vs_terminate,
    plot_points,
)
from shop_r1.metrics import compute_metrics, load_predictions, write_predictions  # noqa: E402


def _machine() -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import machine  # benchmarks/common.py: the same name the benchmark results use

    return machine()


def _machine_name() -> str:
    return _machine()["name"]


def _machine_note() -> str:
    """What the tables were made on, in words (this machine's, not a constant: sessions run on different CPUs)."""
    m = _machine()
    if m.get("gpus"):
        return f"{len(m['gpus'])}x {m['gpus'][0]}"
    return f"{m['cpu_cores']}-core CPU ({m['cpu_model']}, {m['cpu_isa'].upper()}, {m['ram_gib']} GiB), no GPU"


def _settings(ws: Path, rows: list) -> list[Setting]:
    """The rows evaluated so far and, when the workspace has its data, the baselines on the held-out examples."""
    settings = [Setting(r.label, "model", load_predictions(path), name=r.name) for r in rows
                if (path := ws / "eval" / r.name / "predictions.jsonl").exists()]
    test, train = ws / "data" / "rl_test.jsonl", training_file(ws / "data")
    if settings and test.exists() and train is not None:
        settings += baseline_settings(train, test)
    return settings


def _rl_done(ws: Path, row: Row) -> dict[str, Any] | None:
    """The GRPO run's done.json of a row (steps, rewards, seconds), None for a row without one."""
    done = ws / "rl" / row.name / "done.json"
    return json.loads(done.read_text()) if done.exists() else None


def _row_result(row: Row, c: Comparison, rl: dict[str, Any] | None) -> dict[str, Any]:
    """results.json's entry of one row (the keys of the earlier tables kept: metrics, intervals, minus_sft), with its
    GRPO run's `rl` record where it has one."""
    r = c.row(row.label)
    out: dict[str, Any] = {"metrics": r.metrics.to_dict(),
                           "intervals": {k: v.to_dict() for k, v in r.intervals.items()}}
    if r.vs_reference is not None:
        out["minus_sft"] = {k: v.to_dict() for k, v in r.vs_reference.items()}
    if r.vs_best_baseline is not None:
        out["minus_best_baseline"] = {k: v.to_dict() for k, v in r.vs_best_baseline.items()}
        out["best_baseline"] = c.best_baseline
    if rl is not None:
        out["rl"] = rl
    return out


def _write_predictions(settings: list[Setting], folder: Path) -> list[str]:
    """folder/<row>.jsonl.gz (example_id, response, target) for every row of the table, models and baselines, on the
    examples of the table (the first row's, in its order)."""
    ids = settings[0].predictions.example_ids
    return [write_predictions(s.predictions.select(ids), folder / f"{s.name}.jsonl.gz").name for s in settings]


def _rl_log(ws: Path, name: str) -> list[dict]:
    """A GRPO run's metrics, one record per step (a resumed run logs the steps after its checkpoint again: the last
    record of a step is kept). Step 0 holds only `val/*` when rl.val_every > 0."""
    path = ws / "rl" / name / "metrics_grpo.jsonl"
    if not path.exists():
        return []
    from shop_r1.tracking import read_metrics

    return read_metrics(path)


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


def _plots(ws: Path, rows: list, out: Path, suffix: str = "") -> list[str]:
    """reward.png and action_mix.png of the GRPO runs' training steps, validation.png of their `val/*` records (when
    rl.val_every > 0); `suffix` goes before `.png` (one set per seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = {r.label: _rl_log(ws, r.name) for r in rows if r.rl_overrides is not None}
    train = {k: [r for r in v if "reward/total" in r] for k, v in logs.items()}
    train = {k: v for k, v in train.items() if v}
    made = []
    if train:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        for label, log in train.items():
            steps = [r["step"] for r in log]
            axes[0].plot(steps, _smooth([r["reward/total"] for r in log]), label=label)
            axes[1].plot(steps, _smooth([r["reward/format"] + r["reward/action_type"] + r["reward/attribute"]
                                         for r in log]), label=label)
        axes[0].set_title("mean total reward of the rollouts (5-step mean)")
        axes[1].set_title("format + type + attribute reward (5-step mean)")
        for ax in axes:
            ax.set_xlabel("GRPO step")
        made.append(_save(fig, axes, out / f"reward{suffix}.png", legend_size=7))
        kinds = ("click", "type_and_submit", "terminate", "invalid")
        fig, axes = plt.subplots(1, len(train), figsize=(4 * len(train), 3.5), squeeze=False)
        for ax, (label, log) in zip(axes[0], train.items()):
            steps = [r["step"] for r in log]
            ax.stackplot(steps, *[_smooth([r[f"rollout/type_{k}"] for r in log]) for k in kinds], labels=kinds,
                         alpha=0.85)
            ax.set_title(label, fontsize=9)
            ax.set_ylim(0, 1)
            ax.set_xlabel("GRPO step")
        axes[0][0].set_ylabel("share of rollouts")
        axes[0][-1].legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(out / f"action_mix{suffix}.png", dpi=110)
        plt.close(fig)
        made.append(f"action_mix{suffix}.png")
    val = {k: [r for r in v if "val/exact" in r] for k, v in logs.items()}
    val = {k: v for k, v in val.items() if v}
    if val:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        for label, log in val.items():
            steps = [r["step"] for r in log]
            axes[0].plot(steps, [100 * r["val/exact"] for r in log], marker=".", label=label)
            axes[1].plot(steps, [100 * r.get("val/pred_terminate", 0.0) for r in log], marker=".", label=label)
        axes[0].set_title("validation subset: exact match % (greedy)")
        axes[1].set_title("validation subset: predicted terminate %")
        for ax in axes:
            ax.set_xlabel("GRPO step (0: the SFT model)")
        made.append(_save(fig, axes, out / f"validation{suffix}.png", legend_size=7))
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
    out = {}
    for r in rows:
        key = f"{workspace}/{r.name}" if workspace and f"{workspace}/{r.name}" in PAPER else r.name
        if key in PAPER:
            out[r.label] = " / ".join(f"{x:.2f}" for x in PAPER[key])
    return out


def headroom_lines(ws: Path, rows: Sequence[Row]) -> list[str]:
    """The headroom (pass@1, the samples' exact, pass@k, per target type: shop_r1/headroom.py) of the rows whose
    evaluation drew samples (`eval.headroom_examples` > 0 wrote eval/<row>/headroom.json), as a code block with its
    note where pass@k is close to pass@1; no lines when no row has one (an evaluation made before it existed)."""
    from shop_r1.headroom import Headroom, format_headroom

    found = [(r.label, Headroom.from_dict(json.loads(path.read_text()))) for r in rows
             if (path := ws / "eval" / r.name / "headroom.json").exists()]
    return ["```", format_headroom(found), "```", ""] if found else []


def _table(rows: list, c: Comparison | None, workspace: str) -> list[str]:
    """The comparison (models, then baselines) as Markdown, the paper beside it; rows not evaluated yet listed."""
    paper = _paper(rows, workspace)
    done = {r.label for r in c.rows} if c is not None else set()
    missing = [f"- {r.label}: not run yet (paper: {paper.get(r.label, '-')})" for r in rows if r.label not in done]
    return [*(comparison_markdown(c, paper) if c is not None else []), *missing]


def summarize(suite_name: str, suite: Suite, ws: Path, results_root: Path) -> Path:
    out = results_root / _machine_name() / suite_name
    out.mkdir(parents=True, exist_ok=True)
    rows = [Row(ALIASES.get(r.name, r.name), r.label, r.rl_overrides, r.model) for r in suite.rows]
    settings = _settings(ws, rows)
    c = compare(settings, reference="SFT") if settings else None
    results = {r.name: _row_result(r, c, _rl_done(ws, r)) for r in rows
               if c is not None and r.label in {x.label for x in c.rows}}
    stats = json.loads((ws / "data" / "stats.json").read_text()) if (ws / "data" / "stats.json").exists() else {}
    times = json.loads((ws / "stage_seconds.json").read_text()) if (ws / "stage_seconds.json").exists() else {}
    config = (ws / "config.yaml").read_text() if (ws / "config.yaml").exists() else ""
    payload = {"suite": suite_name, "machine": _machine_note(), "rows": {r.name: r.label for r in rows},
               "results": results, "comparison": c.to_dict() if c is not None else None, "stage_seconds": times,
               "data": {k: stats.get(k) for k in ("rl_train", "rl_test", "num_sft_train", "num_rl_over_budget",
                                                  "num_rl_test_over_budget")}}
    (out / "results.json").write_text(json.dumps(payload, indent=2))
    (out / "config.yaml").write_text(config)
    written = _write_predictions(settings, out / "predictions") if settings else []
    plots = _plots(ws, rows, out)
    if suite_name == "fig2":
        plots += _temperature_plot(rows, results, out)
    if c is not None and (p := plot_exact_vs_terminate(plot_points(suite_name, c), out / "exact_vs_terminate.png")):
        plots.append(p.name)
    test = stats.get("rl_test") or {}
    md = [f"# {suite_name} on {_machine_note()}", "",
          f"Held-out: {test.get('num_examples', '?')} RL examples of unseen sessions "
          f"({stats.get('num_rl_test_over_budget', '?')} dropped for length); greedy decoding. Baselines (in italics) "
          f"are fitted on the workspace's training split and scored on the same held-out examples.", "",
          *_table(rows, c, suite.workspace), "", *headroom_lines(ws, rows),
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


# ---------------------------------------------------------------------------------------------- v2: over seeds

AGG_METRICS = ("exact_match", "type_kappa", "exact_match_non_terminate", "predicted_terminate")
"""Averaged over seeds, beside `minus_sft` and `minus_best_baseline` (paired point differences in exact match)."""


def mean_sd(values: Sequence[float]) -> dict[str, Any]:
    """Mean and sample SD (n - 1; None for a single value) of one figure over the seeds."""
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else None,
            "n": len(values)}


def _figures(r: ComparisonRow) -> dict[str, float]:
    m = r.metrics
    out = {"exact_match": m.exact_match, "type_kappa": m.type_kappa,
           "exact_match_non_terminate": m.exact_match_non_terminate,
           "predicted_terminate": (m.predicted_mix or {}).get("terminate", 0.0)}
    if r.vs_reference is not None:
        out["minus_sft"] = r.vs_reference["exact_match"].value
    if r.vs_best_baseline is not None:
        out["minus_best_baseline"] = r.vs_best_baseline["exact_match"].value
    return out


def aggregate(comparisons: Mapping[int, Comparison]) -> dict[str, dict[str, Any]]:
    """Per row name (models and baselines, in order of first appearance): label, kind, per seed its figures and
    session-resampled intervals, and `summary`: each figure's mean and SD over the seeds that have the row."""
    out: dict[str, dict[str, Any]] = {}
    for k, c in comparisons.items():
        for r in c.rows:
            entry = out.setdefault(r.name or r.label, {"label": r.label, "kind": r.kind, "per_seed": {},
                                                       "intervals": {}})
            entry["per_seed"][k] = _figures(r)
            entry["intervals"][k] = {m: iv.to_dict() for m, iv in r.intervals.items()}
    for entry in out.values():
        keys = dict.fromkeys(key for figures in entry["per_seed"].values() for key in figures)
        entry["summary"] = {key: mean_sd([f[key] for f in entry["per_seed"].values() if key in f]) for key in keys}
    return out


def paired(c: Comparison) -> dict[str, Any]:
    """One seed's paired differences in exact match (sessions resampled): Shop-R1 and SFT against that seed's best
    baseline, Shop-R1 against SFT; rows not evaluated are None."""
    rows = {r.name: r for r in c.rows}
    shop, sft = rows.get("shop_r1"), rows.get("sft")
    exact = lambda ivs: ivs["exact_match"].to_dict() if ivs is not None else None  # noqa: E731
    return {"best_baseline": c.best_baseline,
            "best_baseline_exact": c.row(c.best_baseline).metrics.exact_match if c.best_baseline else None,
            "shop_r1_minus_sft": exact(shop.vs_reference) if shop else None,
            "shop_r1_minus_best_baseline": exact(shop.vs_best_baseline) if shop else None,
            "sft_minus_best_baseline": exact(sft.vs_best_baseline) if sft else None}


def oracle(ws: Path) -> float | None:
    """Exact match of the profiled shop's own policy read off each test prompt (the ceiling, 1 - noise in
    expectation); None where the prompts hold no profile (data.synth_version=1, data.persona=false, a sessions
    file) or the workspace has no data yet."""
    from shop_r1.config import load_config

    path, test = ws / "config.yaml", ws / "data" / "rl_test.jsonl"
    if not (path.exists() and test.exists()):
        return None
    cfg = load_config(path)
    if cfg.data.sessions_path or cfg.data.synth_version < 2 or not cfg.data.persona:
        return None
    from shop_r1.data.examples import load_rl_examples
    from shop_r1.data.synth.policy import oracle_exact

    return oracle_exact(load_rl_examples(test))


def _ms(s: Mapping[str, Any] | None, scale: float = 100, digits: int = 2, sign: str = "") -> str:
    if s is None:
        return "-"
    sd = "" if s["sd"] is None else f" ± {scale * s['sd']:.{digits}f}"
    return f"{scale * s['mean']:{sign}.{digits}f}{sd}"


def _iv(d: Mapping[str, float] | None, scale: float = 100, sign: str = "") -> str:
    if d is None:
        return "-"
    return f"{scale * d['value']:{sign}.2f} [{scale * d['low']:{sign}.1f}, {scale * d['high']:{sign}.1f}]"


def shop_r1_minus_continued(settings: Sequence[Setting]) -> dict[str, float] | None:
    """Shop-R1 minus SFT continued for RL's wall time, exact match, paired with sessions resampled as every other
    'vs' column (None where either row is missing): RL has to beat more imitation, not only less."""
    by_name = {s.name: s for s in settings}
    shop, cont = by_name.get("shop_r1"), by_name.get("sft_continued")
    if shop is None or cont is None:
        return None
    return _minus(cont, [shop])["shop_r1"]


def minus_shop_r1(settings: Sequence[Setting], rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """Each RL variant of the Shop-R1 run (a row with GRPO overrides: binary RL, an ablation, a switch, another
    temperature) minus Shop-R1, exact match, paired with sessions resampled: one seed's test of a paper trend.
    Empty where Shop-R1 or every variant is missing."""
    by_name = {s.name: s for s in settings}
    shop = by_name.get("shop_r1")
    variants = [by_name[r.name] for r in rows if r.rl_overrides and r.name in by_name]
    if shop is None or not variants:
        return {}
    return _minus(shop, variants)


def _minus(reference: Setting, others: Sequence[Setting]) -> dict[str, dict[str, float]]:
    """Each of `others` minus `reference` in exact match, paired, sessions resampled (compare's 'vs' column)."""
    c = compare([reference, *others], reference=reference.label)
    return {s.name: c.row(s.label).vs_reference["exact_match"].to_dict() for s in others}


def direction(iv: Mapping[str, float]) -> str:
    """'below' / 'above' where the whole 95% interval of a difference is under / over 0, else 'level'."""
    return "below" if iv["high"] < 0 else "above" if iv["low"] > 0 else "level"


def _variant_table(agg: dict[str, dict[str, Any]], rows: list, variants: dict[int, dict[str, dict[str, float]]]
                   ) -> list[str]:
    """Per RL variant: its paired difference from the Shop-R1 run on each seed, mean ± SD, on how many seeds the
    interval lies below / across / above 0, and the paper's difference in exact match where it reports the row."""
    seeds = [k for k, v in variants.items() if v]
    names = [r.name for r in rows if any(r.name in variants[k] for k in seeds)]
    if not names:
        return []
    head = ["Setting", *(f"seed {k}: − Shop-R1 (pp) [95% CI]" for k in seeds), "mean ± SD (pp)",
            "seeds below / level / above", "Paper: − Shop-R1 (pp, exact)"]
    lines = ["", "Each RL variant against the Shop-R1 run of its seed (paired differences in exact match, sessions "
             "resampled; below 0: the variant is worse, as the paper's ablations are):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        ivs = [variants[k].get(name) for k in seeds]
        have = [iv for iv in ivs if iv is not None]
        counts = [sum(direction(iv) == d for iv in have) for d in ("below", "level", "above")]
        paper = f"{PAPER[name][0] - PAPER['shop_r1'][0]:+.2f}" if name in PAPER else "-"
        lines.append("| " + " | ".join([agg[name]["label"], *(_iv(iv, sign="+") for iv in ivs),
                                        _ms(mean_sd([iv["value"] for iv in have]), sign="+"),
                                        " / ".join(map(str, counts)), paper]) + " |")
    return lines


def _seed_tables(agg: dict[str, dict[str, Any]], rows: list, pairs: dict[int, dict], oracles: dict[int, float | None],
                 paper: dict[str, str]) -> list[str]:
    """The mean ± SD table (models in suite order, then the baselines) and the per-seed paired table."""
    order = [r.name for r in rows if r.name in agg] + [n for n, e in agg.items() if e["kind"] == "baseline"]
    head = ["Setting", "Exact %", "kappa", "Exact non-term. %", "Pred. terminate %", "vs SFT (pp)",
            "vs best baseline (pp)", "Exact % per seed [95% CI]", "seeds", "Paper: exact / type acc. / F1 %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in order:
        e, s = agg[name], agg[name]["summary"]
        label = e["label"] if e["kind"] == "model" else f"*{e['label']}* (baseline)"
        per_seed = "; ".join(f"s{k}: {_iv(iv['exact_match'])}" for k, iv in e["intervals"].items())
        lines.append("| " + " | ".join([
            label, _ms(s["exact_match"]), _ms(s["type_kappa"], 1, 3, "+"), _ms(s["exact_match_non_terminate"]),
            _ms(s["predicted_terminate"]), _ms(s.get("minus_sft"), sign="+"),
            _ms(s.get("minus_best_baseline"), sign="+"), per_seed, str(s["exact_match"]["n"]),
            paper.get(e["label"], "-")]) + " |")
    head2 = ["Seed", "Shop-R1 − SFT (pp) [95% CI]", "Shop-R1 − SFT continued (pp)", "best baseline (exact %)",
             "Shop-R1 − best baseline (pp)", "SFT − best baseline (pp)", "Oracle ceiling %"]
    lines += ["", "Paired differences in exact match per seed (sessions resampled; above 0: the first is better); the "
              "oracle is the shop's own policy read off each test prompt.", "",
              "| " + " | ".join(head2) + " |", "|" + "---|" * len(head2)]
    for k, p in pairs.items():
        best = f"{p['best_baseline']} ({100 * p['best_baseline_exact']:.2f})" if p["best_baseline"] else "-"
        lines.append("| " + " | ".join([
            str(k), _iv(p["shop_r1_minus_sft"], sign="+"), _iv(p.get("shop_r1_minus_sft_continued"), sign="+"), best,
            _iv(p["shop_r1_minus_best_baseline"], sign="+"),
            _iv(p["sft_minus_best_baseline"], sign="+"),
            f"{100 * oracles[k]:.2f}" if oracles.get(k) is not None else "-"]) + " |")
    known = [v for v in oracles.values() if v is not None]
    if len(pairs) > 1:
        lines.append(f"| mean ± SD | {_mean_of(pairs, 'shop_r1_minus_sft')} | "
                     f"{_mean_of(pairs, 'shop_r1_minus_sft_continued')} | | "
                     f"{_mean_of(pairs, 'shop_r1_minus_best_baseline')} | {_mean_of(pairs, 'sft_minus_best_baseline')}"
                     f" | {_ms(mean_sd(known)) if known else '-'} |")
    return lines


def _mean_of(pairs: dict[int, dict], key: str) -> str:
    values = [p[key]["value"] for p in pairs.values() if p.get(key) is not None]
    return _ms(mean_sd(values), sign="+") if values else "-"


def _temperature_plot_seeds(rows: list, agg: dict[str, dict[str, Any]], base_temperature: float, out: Path
                            ) -> list[str]:
    """Figure 2's axes over seeds: exact match, exact on non-terminate targets, predicted terminates and kappa
    (mean ± SD) against the RL sampling temperature; SFT's means dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = []
    for r in rows:
        temps = [float(o.split("=", 1)[1]) for o in (r.rl_overrides or ()) if o.startswith("rollout.temperature=")]
        temps = temps or ([base_temperature] if r.name == "shop_r1" else [])
        if temps and r.name in agg:
            points.append((temps[0], agg[r.name]["summary"]))
    if not points:
        return []
    points.sort(key=lambda p: p[0])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, keys, scale in ((axes[0], ("exact_match", "exact_match_non_terminate", "predicted_terminate"), 100),
                            (axes[1], ("type_kappa",), 1)):
        for key in keys:
            line = ax.errorbar([t for t, _ in points], [scale * s[key]["mean"] for _, s in points],
                               yerr=[scale * (s[key]["sd"] or 0.0) for _, s in points], marker="o", capsize=3,
                               label=key)
            if "sft" in agg:
                ax.axhline(scale * agg["sft"]["summary"][key]["mean"], ls="--", lw=0.8, color=line[0].get_color())
        ax.set_xlabel("RL sampling temperature")
    axes[0].set_ylabel("% on the test split (mean ± SD over seeds)")
    axes[1].set_ylabel("Cohen's kappa of the action type")
    axes[0].set_title("Shop-R1 vs RL sampling temperature (dashed: SFT)")
    return [_save(fig, axes, out / "temperature.png", legend_size=8)]


def _seed_record(ws: Path, rows: list, c: Comparison | None) -> dict[str, Any]:
    stats = json.loads((ws / "data" / "stats.json").read_text()) if (ws / "data" / "stats.json").exists() else {}
    cont = ws / "sft_continued" / "hf" / "done.json"
    done = {x.label for x in c.rows} if c is not None else set()
    return {"workspace": str(ws), "comparison": c.to_dict() if c is not None else None,
            "results": {r.name: _row_result(r, c, _rl_done(ws, r)) for r in rows
                        if c is not None and r.label in done},
            "not_run": [r.label for r in rows if r.label not in done], "oracle_exact": oracle(ws),
            "stage_seconds": json.loads((ws / "stage_seconds.json").read_text())
            if (ws / "stage_seconds.json").exists() else {},
            "sft_continued": json.loads(cont.read_text()) if cont.exists() else None,
            "data": {k: stats.get(k) for k in ("rl_train", "rl_test", "num_rl_val", "num_rl_test_over_budget")}}


def carried_seeds(results_dir: Path, suite_name: str, rows: Sequence[Row],
                  exclude: Sequence[int] = ()) -> dict[int, tuple[list[Setting], dict[str, Any]]]:
    """The seeds of an earlier summary of this suite (`results_dir`: its results.json and predictions/<seed>/), so a
    table can grow by seeds run on other machines or sessions: per seed not in `exclude` that has a table, its rows'
    settings (models and baselines) rebuilt from the committed predictions, and its record (with the machine it ran
    on). Refused, naming the file: another suite's table, a model row the suite's `rows` do not hold under that name
    and label, a missing predictions file, or metrics recomputed from a file that differ from the record's."""
    path = results_dir / "results.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no results.json to carry seeds from")
    saved = json.loads(path.read_text())
    if saved.get("suite") != suite_name:
        raise ValueError(f"{path}: a {saved.get('suite')!r} table, not {suite_name!r}")
    labels = {r.name: r.label for r in rows}
    out: dict[int, tuple[list[Setting], dict[str, Any]]] = {}
    for key, rec in (saved.get("per_seed") or {}).items():
        k = int(key)
        if k in exclude or not rec.get("comparison"):
            continue
        settings = []
        for row in rec["comparison"]["rows"]:
            if row["kind"] == "model" and labels.get(row["name"]) != row["label"]:
                raise ValueError(f"{path}: seed {k}'s row {row['name']!r} ({row['label']!r}) is not a row of "
                                 f"{suite_name} as defined now ({labels})")
            pred = results_dir / "predictions" / key / f"{row['name']}.jsonl.gz"
            if not pred.exists():
                raise FileNotFoundError(f"{pred}: seed {k}'s row {row['label']!r} has no predictions to carry")
            settings.append(Setting(row["label"], row["kind"], load_predictions(pred), row.get("reward_total"),
                                    row.get("note", ""), row["name"]))
            recomputed = json.loads(json.dumps(compute_metrics(settings[-1].predictions.responses,
                                                               settings[-1].predictions.targets).to_dict()))
            if recomputed != row["metrics"]:
                diff = sorted(m for m in {*recomputed, *row["metrics"]} if recomputed.get(m) != row["metrics"].get(m))
                raise ValueError(f"{pred}: metrics recomputed from the predictions differ from {path} (seed {k}, "
                                 f"{row['label']!r}: {', '.join(diff)})")
        out[k] = (settings, {**rec, "machine": rec.get("machine") or saved.get("machine"),
                             "carried_from": rec.get("carried_from") or str(results_dir)})
    return out


def _carried_record(rec: dict[str, Any], rows: list, c: Comparison) -> dict[str, Any]:
    """A carried seed's record with its comparison, row results and unrun rows taken from the comparison made now
    (only each GRPO run's `rl` entry kept from the record: its workspace is elsewhere)."""
    done = {x.label for x in c.rows}
    old = rec.get("results") or {}
    results = {r.name: _row_result(r, c, old.get(r.name, {}).get("rl")) for r in rows if r.label in done}
    return {**rec, "comparison": c.to_dict(), "results": results,
            "not_run": [r.label for r in rows if r.label not in done]}


def summarize_seeds(suite_name: str, suite: Suite, workspaces: Mapping[int, Path], results_root: Path,
                    carry_from: Path | None = None) -> Path:
    """A v2 suite over its seed workspaces: each seed's own comparison (models and baselines, intervals, paired
    differences), the mean ± SD over seeds, the per-seed paired table with the oracle ceiling, predictions/<seed>/,
    and the plots (exact vs terminate over every seed's rows; per seed the GRPO runs' reward, mix and validation).
    With `carry_from` (an earlier summary of this suite) its other seeds join the table from their committed
    predictions and records (`carried_seeds`), their per-seed plots copied."""
    from shop_r1.config import load_config

    out = results_root / _machine_name() / suite_name
    out.mkdir(parents=True, exist_ok=True)
    rows = list(suite.rows)
    live = {k: _settings(ws, rows) for k, ws in workspaces.items()}
    # A seed whose workspace here has a table is summarized from it; one without (not started, or not on this
    # machine) is carried when the earlier summary has it.
    carried = carried_seeds(carry_from, suite_name, rows, exclude=[k for k, st in live.items() if st]) \
        if carry_from is not None else {}
    comparisons: dict[int, Comparison] = {}
    continued: dict[int, dict[str, float] | None] = {}
    variants: dict[int, dict[str, dict[str, float]]] = {}
    per_seed: dict[int, dict[str, Any]] = {}
    plots: list[str] = []
    for k in sorted({*workspaces, *carried}):
        settings = carried[k][0] if k in carried else live[k]
        c = compare(settings, reference="SFT") if settings else None
        if k in carried:
            per_seed[k] = _carried_record(carried[k][1], rows, c)
            for png in sorted(carry_from.glob(f"*_seed{k}.png")):
                if png.resolve() != (out / png.name).resolve():
                    shutil.copy(png, out / png.name)
                plots.append(png.name)
        else:
            per_seed[k] = _seed_record(workspaces[k], rows, c)
            if c is not None:
                plots += _plots(workspaces[k], rows, out, suffix=f"_seed{k}")
        if c is not None:
            comparisons[k] = c
            continued[k] = shop_r1_minus_continued(settings)
            variants[k] = minus_shop_r1(settings, rows)
            _write_predictions(settings, out / "predictions" / str(k))
    agg = aggregate(comparisons)
    pairs = {k: {**paired(c), "shop_r1_minus_sft_continued": continued[k]} for k, c in comparisons.items()}
    oracles = {k: per_seed[k]["oracle_exact"] for k in per_seed}
    configs = [ws / "config.yaml" for ws in workspaces.values() if (ws / "config.yaml").exists()]
    if carried and (carry_from / "config.yaml").exists():
        configs.append(carry_from / "config.yaml")
    versions = sorted({load_config(c).data.synth_version for c in configs})
    if configs:
        if configs[0].resolve() != (out / "config.yaml").resolve():
            shutil.copy(configs[0], out / "config.yaml")
        if suite_name == "v2_fig2":
            plots += _temperature_plot_seeds(rows, agg, load_config(configs[0]).rollout.temperature, out)
    points = [p for k, c in comparisons.items() for p in plot_points(f"seed {k}", c)]
    if (p := plot_exact_vs_terminate(points, out / "exact_vs_terminate.png")) is not None:
        plots.insert(0, p.name)
    payload = {"suite": suite_name, "machine": _machine_note(), "seeds": list(per_seed),
               "rows": {r.name: r.label for r in rows}, "notes": list(suite.notes), "aggregate": agg,
               "paired": pairs, "minus_shop_r1": variants, "oracle_exact": oracles, "per_seed": per_seed}
    (out / "results.json").write_text(json.dumps(payload, indent=2))
    md = [f"# {suite_name} on {_machine_note()}", "",
          *([f"Synthetic shop version {', '.join(map(str, versions))} (`data.synth_version`"
             f"{'; the seeds differ' if len(versions) > 1 else ''}).", ""] if versions else []),
          f"Seeds {', '.join(map(str, per_seed))}: each its own workspace (`seed=k data.synth_seed=k`: data, model, "
          "SFT and RL)" + "".join(
              f"; seed {k} carried from an earlier run of this suite (its committed predictions re-read"
              + (f"; it ran on {per_seed[k]['machine']}" if per_seed[k].get("machine") != _machine_note() else "")
              + ")" for k in sorted(carried))
          + ". Test split per seed: " + "; ".join(
              f"s{k} n={c.n} ({c.num_sessions} sessions)" for k, c in comparisons.items()) + ". Greedy decoding. "
          "Mean ± SD over the seeds (SD with n - 1); baselines (in italics) are fitted on each seed's training "
          "split and scored on its test split; 'vs' columns: paired differences in exact match, points.", "",
          *(_seed_tables(agg, rows, pairs, oracles, _paper(rows, "")) if agg else ["No row evaluated yet."]),
          *_variant_table(agg, rows, variants), "",
          *[f"- {n}" for n in suite.notes],
          *[f"- not run yet, seed {k}: {', '.join(r['not_run'])}" for k, r in per_seed.items() if r["not_run"]], ""]
    for k, c in comparisons.items():
        rec = per_seed[k]
        cont = rec["sft_continued"]
        md += [f"## Seed {k}", "", *comparison_markdown(c, _paper(rows, "")), "",
               *(headroom_lines(workspaces[k], rows) if k in workspaces else []),
               *([f"SFT continued: {cont['steps']} more SFT steps = floor({cont['plan']['rl_seconds']:.0f} s of "
                  f"Shop-R1 GRPO / {cont['plan']['seconds_per_step']:.2f} s per SFT step).", ""] if cont else []),
               "Stage times (s): " + ", ".join(f"{n} {v:.0f}" for n, v in rec["stage_seconds"].items()), ""]
    md += ["Per-example predictions behind every row: `predictions/<seed>/<row>.jsonl.gz`.", "",
           *[f"![{p}]({p})" for p in plots]]
    (out / "table.md").write_text("\n".join(md) + "\n")
    return out


def plot_all(machine_dir: Path) -> Path | None:
    """Exact match vs predicted terminates for every row of every table under `machine_dir` (each suite's
    results.json with a `comparison`, or per seed for the v2 suites; older files without one are skipped and
    named)."""
    points, skipped = [], []
    for path in sorted(machine_dir.glob("*/results.json")):
        saved = json.loads(path.read_text())
        tables = [saved["comparison"]] if saved.get("comparison") else \
            [s["comparison"] for s in (saved.get("per_seed") or {}).values() if s.get("comparison")]
        points += [p for t in tables for p in plot_points(path.parent.name, t)]
        if not tables:
            skipped.append(path.parent.name)
    if skipped:
        print(f"plot_all: no comparison (re-run summarize) in: {', '.join(skipped)}", flush=True)
    return plot_exact_vs_terminate(points, machine_dir / "exact_vs_terminate.png",
                                   title="Every row of every table: exact match vs predicted terminates")


if __name__ == "__main__":
    import argparse

    from shop_r1.config import load_config

    parser = argparse.ArgumentParser()
    parser.add_argument("suite", nargs="?", choices=[*sorted(SUITES), *V2_SUITES])
    parser.add_argument("--root", default=str(ROOT / "runs" / "experiments"))
    parser.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(V2_SEEDS), help="v2 suites: the seeds to read")
    parser.add_argument("--plot-all", action="store_true", help="plot every row of every table of this machine")
    parser.add_argument("--carry", default=None, help="v2 suites: an earlier summary whose other seeds join the table")
    args = parser.parse_args()
    if args.suite in V2_SUITES:
        wss = {k: seed_workspace(Path(args.root), k) for k in args.seeds}
        made = [w / "config.yaml" for w in wss.values() if (w / "config.yaml").exists()]
        if not made:
            parser.error(f"no v2 workspace under {args.root}/v2 for seeds {args.seeds}")
        carry = Path(args.carry) if args.carry else None
        if carry is not None:  # the seeds not made here are the carried table's, not "not run yet"
            check_carry(carry, load_config(made[0]), Path(args.root))
            wss = {k: w for k, w in wss.items() if (w / "config.yaml").exists()}
        print(summarize_seeds(args.suite, v2_suite(args.suite, load_config(made[0])), wss, Path(args.results), carry))
    elif args.suite:
        s = SUITES[args.suite]
        print(summarize(args.suite, s, Path(args.root) / s.workspace if s.workspace else Path(args.root),
                        Path(args.results)))
    if args.plot_all:
        print(plot_all(Path(args.results) / _machine_name()))
    if not args.suite and not args.plot_all:
        parser.error("give a suite, --plot-all, or both")
