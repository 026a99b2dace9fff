"""One results table, with its baselines: every setting (models and trivial baselines) on the same held-out
examples, through the same metric code, with session-resampled intervals (issue 21, section 1).

Per row: exact match [95% CI], Cohen's kappa of the action type [CI], type accuracy and macro-F1, exact match on the
non-terminate targets, exact per target type, the predicted type mix (beside the target mix, which every row
shares), and two paired differences in exact match: against the reference row (SFT) and against the best baseline
(the baseline with the highest exact match on these examples: chosen on the held-out set, which can only favour the
baseline, so a model's margin over it is conservative). Intervals: percentile bootstrap over sessions
(`shop_r1.bootstrap`), the same draws for every row, so differences are paired. Pure: no model, no engine.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from shop_r1.baselines import baselines, load_visible
from shop_r1.bootstrap import Interval, bootstrap_intervals, paired_difference
from shop_r1.metrics import EvalMetrics, Predictions, compute_metrics, format_mix
from shop_r1.types import ACTION_TYPES

NUM_RESAMPLES = 2000


@dataclass(frozen=True)
class Setting:
    """One row's predictions on the held-out examples."""

    label: str
    kind: Literal["model", "baseline"]
    predictions: Predictions
    reward_total: float | None = None
    """Mean total reward of the responses (models only)."""
    note: str = ""
    name: str = ""
    """A file-safe id (an experiment row's name, a baseline's name); empty: none."""


def _intervals(ivs: dict[str, Interval] | None) -> dict[str, dict[str, float]] | None:
    return None if ivs is None else {k: v.to_dict() for k, v in ivs.items()}


@dataclass(frozen=True)
class ComparisonRow:
    label: str
    kind: Literal["model", "baseline"]
    metrics: EvalMetrics
    intervals: dict[str, Interval]
    """Point value and 95% session-bootstrap interval per `shop_r1.bootstrap.METRICS` key."""
    vs_reference: dict[str, Interval] | None
    """Each metric of this row minus the reference row's (paired); None for the reference itself or without one."""
    vs_best_baseline: dict[str, Interval] | None
    """Each metric of this row minus the best baseline's (paired); None for that baseline itself or without one."""
    reward_total: float | None = None
    note: str = ""
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "name": self.name, "kind": self.kind, "metrics": self.metrics.to_dict(),
                "intervals": _intervals(self.intervals),
                "vs_reference": _intervals(self.vs_reference), "vs_best_baseline": _intervals(self.vs_best_baseline),
                "reward_total": self.reward_total, "note": self.note}


@dataclass(frozen=True)
class Comparison:
    rows: tuple[ComparisonRow, ...]
    reference: str
    """The label the `vs_reference` differences are taken against (absent from the rows: no such column)."""
    best_baseline: str | None
    n: int
    num_sessions: int
    num_resamples: int

    def row(self, label: str) -> ComparisonRow:
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(f"no row {label!r}; rows: {[r.label for r in self.rows]}")

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "best_baseline": self.best_baseline, "n": self.n,
                "num_sessions": self.num_sessions, "num_resamples": self.num_resamples,
                "intervals": "95% percentile bootstrap over sessions; differences paired (same session draws)",
                "rows": [r.to_dict() for r in self.rows]}


def baseline_settings(train_examples_path: str | Path, test_examples_path: str | Path) -> list[Setting]:
    """The three trivial baselines (`shop_r1.baselines`) fitted on the training file, on every test example."""
    test = load_visible(test_examples_path)
    targets = tuple(v.target for v in test)
    return [Setting(b.label, "baseline", Predictions(b.example_ids, b.responses, targets), note=b.description,
                    name=b.name) for b in baselines(load_visible(train_examples_path), test)]


def compare(settings: Sequence[Setting], reference: str = "SFT", num_resamples: int = NUM_RESAMPLES,
            seed: int = 0) -> Comparison:
    """Every setting on the first setting's examples (the others are aligned to them by example id; the targets
    must agree), with intervals and paired differences."""
    if not settings:
        raise ValueError("compare: no settings")
    labels = [s.label for s in settings]
    if len(set(labels)) != len(labels):
        raise ValueError(f"compare: duplicate row labels {labels}")
    ids = settings[0].predictions.example_ids
    preds = {s.label: s.predictions.select(ids) for s in settings}
    targets = preds[labels[0]].targets
    for s in settings:
        if preds[s.label].targets != targets:
            raise ValueError(f"compare: {s.label!r} has other targets than {labels[0]!r} for the same example ids")
    sessions = preds[labels[0]].sessions
    base = [s for s in settings if s.kind == "baseline"]
    metrics = {s.label: compute_metrics(preds[s.label].responses, targets) for s in settings}
    best = max(base, key=lambda s: metrics[s.label].exact_match).label if base else None

    def diff(a: str | None, b: str) -> dict[str, Interval] | None:
        if a is None or a not in preds or a == b:
            return None
        return paired_difference(preds[a].responses, preds[b].responses, targets, num_resamples, seed=seed,
                                 sessions=sessions)

    rows = tuple(ComparisonRow(s.label, s.kind, metrics[s.label],
                               bootstrap_intervals(preds[s.label].responses, targets, num_resamples, seed=seed,
                                                   sessions=sessions),
                               diff(reference, s.label), diff(best, s.label), s.reward_total, s.note, s.name)
                 for s in settings)
    return Comparison(rows, reference, best, len(ids), len(set(sessions)), num_resamples)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _ci(iv: Interval) -> str:
    return f"{100 * iv.value:.2f} [{100 * iv.low:.1f}, {100 * iv.high:.1f}]"


def _diff(ivs: dict[str, Interval] | None) -> str:
    """The paired difference in exact match, in points."""
    if ivs is None:
        return "-"
    iv = ivs["exact_match"]
    return f"{100 * iv.value:+.2f} [{100 * iv.low:+.1f}, {100 * iv.high:+.1f}]"


def _per_type(m: EvalMetrics) -> str:
    return "/".join(f"{100 * m.per_type[k].exact_match:.0f}" if k in m.per_type else "-" for k in ACTION_TYPES)


def _best_label(c: Comparison) -> str:
    return f"best baseline ({c.best_baseline})" if c.best_baseline else "best baseline"


def _columns(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Fixed-width text: each column as wide as its widest cell, two spaces apart; the first left-aligned."""
    widths = [max(len(r[j]) for r in (head, *rows)) for j in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [fmt(head), "-" * len(fmt(head)), *[fmt(r) for r in rows]]


def format_comparison(c: Comparison) -> str:
    """Two fixed-width blocks: agreement and the paired differences; then the per-type picture and the mixes."""
    head = ["Setting", "Exact % [95% CI]", "kappa", "Type acc %", "F1 %", f"vs {c.reference} (pp)",
            "vs best baseline (pp)", "n"]
    rows = [[r.label, _ci(r.intervals["exact_match"]), f"{r.metrics.type_kappa:+.3f}", _pct(r.metrics.type_accuracy),
             _pct(r.metrics.type_macro_f1), _diff(r.vs_reference), _diff(r.vs_best_baseline), str(r.metrics.n)]
            for r in c.rows]
    head2 = ["Setting", "Exact non-term. %", "Exact by target c/t/x %", "Predicted mix c/t/x/? %", "Reward"]
    rows2 = [[r.label, _pct(r.metrics.exact_match_non_terminate), _per_type(r.metrics),
              format_mix(r.metrics.predicted_mix).split(" ", 1)[-1],
              f"{r.reward_total:.3f}" if r.reward_total is not None else "-"] for r in c.rows]
    target_mix = format_mix(c.rows[0].metrics.target_mix) if c.rows else "-"
    note = (f"Target mix {target_mix} (n={c.n}, {c.num_sessions} sessions). 95% percentile bootstrap over sessions "
            f"({c.num_resamples:,} resamples). 'vs' columns: paired differences in exact match, the same session "
            f"draws for both rows (above 0: the row is better); {_best_label(c)} is the baseline with the highest "
            "exact match on these examples.")
    return "\n".join([*_columns(head, rows), "", *_columns(head2, rows2), "", *textwrap.wrap(note, 118),
                      *[ln for n in _notes(c) for ln in textwrap.wrap(n, 118, subsequent_indent="  ")]])


def _notes(c: Comparison) -> list[str]:
    return [f"{r.label}: {r.note}" for r in c.rows if r.kind == "baseline" and r.note]


def comparison_markdown(c: Comparison, paper: Mapping[str, str] | None = None) -> list[str]:
    """The same table as Markdown lines; `paper`: an optional extra column, label -> text."""
    head = ["Setting", "Exact % [95% CI]", "kappa [95% CI]", "Type acc. %", "Type F1 %", "Exact non-term. %",
            "Exact by target c/t/x %", "Predicted mix c/t/x/? %", f"vs {c.reference} (pp)",
            f"vs {_best_label(c)} (pp)", "n"]
    if paper is not None:
        head.append("Paper: exact / type acc. / F1 %")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in c.rows:
        m, k = r.metrics, r.intervals["type_kappa"]
        label = r.label if r.kind == "model" else f"*{r.label}* (baseline)"
        cells = [label, _ci(r.intervals["exact_match"]), f"{k.value:+.3f} [{k.low:+.2f}, {k.high:+.2f}]",
                 _pct(m.type_accuracy), _pct(m.type_macro_f1), _pct(m.exact_match_non_terminate), _per_type(m),
                 format_mix(m.predicted_mix).split(" ", 1)[-1], _diff(r.vs_reference), _diff(r.vs_best_baseline),
                 str(m.n)]
        if paper is not None:
            cells.append(paper.get(r.label, "-"))
        lines.append("| " + " | ".join(cells) + " |")
    target_mix = format_mix(c.rows[0].metrics.target_mix) if c.rows else "-"
    lines += ["", f"Target mix {target_mix} (n={c.n}, {c.num_sessions} sessions). Intervals: 95% percentile "
              f"bootstrap over sessions ({c.num_resamples:,} resamples); 'vs' columns: paired differences in exact "
              "match (same session draws; above 0: the row is better). The best baseline is the baseline with the "
              "highest exact match on these examples.", "", *[f"- {n}" for n in _notes(c)]]
    return lines


@dataclass(frozen=True)
class PlotPoint:
    table: str
    label: str
    kind: str
    exact_match: float
    predicted_terminate: float
    """Share of responses that are `terminate`."""
    target_terminate: float
    """Share of targets that are `terminate` (the slope of the no-discrimination line)."""


def plot_points(table: str, c: Comparison | Mapping[str, Any]) -> list[PlotPoint]:
    """The rows of a comparison, or of its `to_dict()` as results.json holds it."""
    rows = c.to_dict()["rows"] if isinstance(c, Comparison) else c["rows"]
    return [PlotPoint(table, r["label"], r["kind"], m["exact_match"], m["predicted_mix"].get("terminate", 0.0),
                      m["target_mix"].get("terminate", 0.0)) for r in rows for m in [r["metrics"]]]


def plot_exact_vs_terminate(points: Sequence[PlotPoint], path: str | Path, title: str = "") -> Path | None:
    """Exact match against the share of predicted terminates, one point per row of every table. The dashed line is
    what predicting terminate at that rate *at random* (and nothing else right) scores: target terminate share x
    predicted share. A row on the line gains only by the prior; discrimination lifts it above."""
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    tables = list(dict.fromkeys(p.table for p in points))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, t in enumerate(tables):
        mine = [p for p in points if p.table == t]
        for kind, marker in (("model", "o"), ("baseline", "x")):
            pts = [p for p in mine if p.kind == kind]
            if pts:
                ax.scatter([100 * p.predicted_terminate for p in pts], [100 * p.exact_match for p in pts],
                           marker=marker, color=colors[i % len(colors)], label=f"{t} ({kind}s)")
        for p in mine:
            ax.annotate(p.label, (100 * p.predicted_terminate, 100 * p.exact_match), fontsize=6,
                        xytext=(3, 2), textcoords="offset points")
    for share in sorted({round(p.target_terminate, 4) for p in points}):
        ax.plot([0, 100], [0, 100 * share], ls="--", lw=0.8, color="grey")
    ax.set_xlim(-2, 102)
    ax.set_xlabel("predicted terminate (% of responses)")
    ax.set_ylabel("exact match (%)")
    ax.set_title(title or "Exact match vs share of predicted terminates (dashed: terminate at random)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
