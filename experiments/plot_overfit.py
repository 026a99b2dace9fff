"""One figure of several overfit checks' on-policy exact curves (experiments/overfit.py's curve.json files).

    .venv/bin/python experiments/plot_overfit.py OUT.png DIR [DIR ...]

Each DIR holds a curve.json; its line is the share of the step's samples that are exact, as a moving mean over
`--window` steps (default 10, the curve's own first/last window), labelled with the folder's name and its greedy
exact before -> after.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def moving_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and up to window - 1 values before it (a trailing window; shorter at the start)."""
    if window < 1:
        raise ValueError(f"window must be >= 1 (got {window})")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the PNG to write")
    ap.add_argument("dirs", nargs="+", help="overfit check folders, each with a curve.json")
    ap.add_argument("--window", type=int, default=10, help="steps in the moving mean (default 10)")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for d in args.dirs:
        path = Path(d) / "curve.json"
        try:
            curve = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path}: cannot read the curve ({e})") from None
        steps = [p["step"] for p in curve["steps"]]
        exact = moving_mean([p["sample_exact"] for p in curve["steps"]], args.window)
        g = curve["greedy_exact"]
        label = f"{Path(d).name} (greedy {g['before']['exact']} -> {g['after']['exact']} of {g['after']['n']})"
        ax.plot(steps, exact, label=label)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(f"sample exact ({args.window}-step mean)")
    ax.set_ylim(0, 1)
    ax.axhline(0.9, color="grey", lw=0.8, ls="--")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
