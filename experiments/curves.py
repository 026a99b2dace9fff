"""Compute-matched curves (issue 47, section 1): validation exact against training cost for SFT continued and for
GRPO from the same SFT checkpoint, resumable chunk by chunk so a curve is spread over sessions.

    source scripts/env.sh
    .venv/bin/python -m experiments.curves --root runs/curves0 [--sft-model DIR --sft-steps N --sft-seconds S] \
        sft --cycles 14 [--cycle-steps 136]
    .venv/bin/python -m experiments.curves --root runs/curves0 grpo --chunks 20 [--chunk-steps 100] \
        [--from sft|sft+K] [--name NAME]
    .venv/bin/python -m experiments.curves --root runs/curves0 table [--out FILE.json --plot FILE.png]
    .venv/bin/python -m experiments.curves --root runs/curves0 compare sft sft+14 grpo_sft_14_10
    .venv/bin/python -m experiments.curves --root runs/curves0 export --to experiments/results/.../curves_seed0
    (trailing dotted overrides go to the main job's config, configs/demo_cpu.yaml, for every stage; a regime is a
    workspace made with its overrides, e.g. data.rationale_fraction=0.2)

The workspace (`--root`) holds the data (built from the config's seeds, as the pipeline's examples stage does) and
the starting SFT model (`--sft-model`, copied in, its step count and stage seconds the SFT row's cost; without it
`sft` first trains the config's SFT stage from the base model, resumably, and records its own). Then:

    sft   root/sft_more/cycle_K/hf      K SFT cycles after the starting model, each `--cycle-steps` optimizer steps
                                        from the previous cycle's weights with a fresh optimizer, the SFT stage's lr,
                                        warmup ratio and schedule (cosine: warm restarts), exactly the "SFT
                                        continued" row's mechanics (experiments/run.py) repeated; a killed cycle
                                        resumes from its last checkpoint.
    grpo  root/grpo_NAME/chunk_K/hf     GRPO from `--from` (the starting SFT or an SFT cycle's model), the main job's
                                        settings, stopped every `--chunk-steps` steps: chunk K is one run resumed from
                                        chunk K-1's checkpoint with rl.steps = K x chunk-steps (the rl LR is constant,
                                        so the chunks are one run).
    each point's greedy evaluation on the whole validation split: root/points/NAME/metrics.json (`shop-r1 eval`'s
    scorer, session-resampled intervals in its summary)

Cost per point: optimizer steps, learner tokens (SFT: loss tokens; GRPO: the sampled response tokens the
update trains on) and wall seconds as measured (each chunk's done.json; the evaluations not counted). A chunk slowed
by other work beside it would bend a wall-clock axis, so the table also gives clean seconds: steps x the median
seconds per step of the curve's own chunks, and the figure uses them. Every stage is skipped when its output is
complete; `table` reads only what is finished, so it runs beside a curve still training.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.same_config import config_changes, with_overrides  # noqa: E402
from shop_r1.atomic import write_atomic  # noqa: E402
from shop_r1.config import load_config, save_config  # noqa: E402
from shop_r1.tracking import read_metrics  # noqa: E402

DEFAULT_CONFIG = ROOT / "configs" / "demo_cpu.yaml"


def _mark(path: Path, info: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(info, indent=2))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


class Curves:
    """One workspace: the data, the starting SFT model, the SFT cycles, the GRPO chunks and their evaluations."""

    def __init__(self, root: Path, config: Path, overrides: list[str], sft_model: Path | None, sft_steps: int,
                 sft_seconds: float) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = with_overrides(load_config(config, overrides), [f"run_dir={self.root}", "logging.wandb=false"])
        saved = self.root / "config.yaml"
        if saved.exists():
            changes = config_changes(load_config(saved), cfg)
            if changes:
                raise SystemExit(f"{self.root} was made with another config ({'; '.join(changes)})")
        else:
            save_config(cfg, saved)
        self.cfg = cfg
        self.start = self.root / "sft" / "hf"
        if not (self.start / "done.json").exists() and sft_model is not None:
            shutil.copytree(sft_model, self.start, dirs_exist_ok=True)
            _mark(self.start / "done.json", {"steps": sft_steps, "seconds": sft_seconds, "copied_from": str(sft_model)})

    def start_sft(self, local: bool) -> None:
        """Without `--sft-model`: the starting SFT is trained here, the config's SFT stage from the base model (a
        regime's own SFT, e.g. on the sessions that keep their rationales), resumable; its steps and seconds are the
        SFT row's cost."""
        from experiments.run import Workspace
        from shop_r1.sft import run_sft

        if (self.start / "done.json").exists():
            return
        t = time.perf_counter()
        out = self.root / "sft"
        cfg = with_overrides(self.cfg, [f"run_dir={out}"])
        base = Workspace(self.cfg, self.root).base_model()
        result = run_sft(cfg, base, self.data()["sft_train"], out, local, resume=(out / "checkpoints").exists())
        _mark(self.start / "done.json", {"steps": result.num_steps, "seconds": round(time.perf_counter() - t, 1),
                                         "trained_from": base, "loss_tokens": _sft_tokens(out)})

    def data(self) -> dict[str, str]:
        from experiments.run import Workspace

        return Workspace(self.cfg, self.root).data()

    def point(self, name: str, model: str, local: bool) -> dict:
        """Greedy exact of `model` on the whole validation split (cached)."""
        from shop_r1.evaluate import evaluate

        out = self.root / "points" / name
        if not (out / "metrics.json").exists():
            t = time.perf_counter()
            evaluate(self.cfg, model, self.data()["rl_val"], out, name, local)
            print(f"<== point {name}: {time.perf_counter() - t:.0f} s", flush=True)
        return _load(out / "metrics.json")

    def cycle_model(self, k: int) -> Path:
        return self.start if k == 0 else self.root / "sft_more" / f"cycle_{k}" / "hf"

    def sft_cycles(self, cycles: int, cycle_steps: int, local: bool) -> None:
        from shop_r1.sft import run_sft

        self.start_sft(local)
        self.point("sft", str(self.start), local)
        for k in range(1, cycles + 1):
            out = self.root / "sft_more" / f"cycle_{k}"
            if not (out / "hf" / "done.json").exists():
                t = time.perf_counter()
                cfg = with_overrides(self.cfg, [f"run_dir={out}", f"sft.max_steps={cycle_steps}"])
                save_config(cfg, out / "config.yaml")
                result = run_sft(cfg, str(self.cycle_model(k - 1)), self.data()["sft_train"], out, local,
                                 resume=(out / "checkpoints").exists())
                _mark(out / "hf" / "done.json", {"steps": result.num_steps, "last_loss": result.last_loss,
                                                 "seconds": round(time.perf_counter() - t, 1),
                                                 "loss_tokens": _sft_tokens(out)})
            self.point(f"sft+{k}", str(out / "hf"), local)

    def grpo_chunks(self, name: str, start: Path, chunks: int, chunk_steps: int, local: bool) -> None:
        from shop_r1.pipeline import _pad_id, _rl_prompts
        from shop_r1.train import run_grpo

        base = self.root / f"grpo_{name}"
        if not (base / "start.json").exists():
            _mark(base / "start.json", {"start": str(start)})
        if _load(base / "start.json")["start"] != str(start):
            raise SystemExit(f"{base} starts from {_load(base / 'start.json')['start']}, not {start}")
        self.point(f"grpo_{name}_0", str(start), local)
        prompts = None
        for k in range(1, chunks + 1):
            out = base / f"chunk_{k}"
            if not (out / "done.json").exists():
                prompts = prompts or _rl_prompts(self.cfg, str(start), self.data()["rl_train"])
                t = time.perf_counter()
                cfg = with_overrides(self.cfg, [f"run_dir={base}", f"rl.steps={k * chunk_steps}", "rl.val_every=0"])
                save_config(cfg, out / "config.yaml")
                result = run_grpo(cfg, str(start), prompts, base / "grpo", local, resume=True,
                                  pad_id=_pad_id(str(start)))
                shutil.copytree(base / "grpo" / "hf", out / "hf", dirs_exist_ok=True)
                _mark(out / "done.json", {"steps": result.num_steps, "seconds": round(time.perf_counter() - t, 1),
                                          "learner_tokens": _grpo_tokens(base, k * chunk_steps,
                                                                                cfg.rl.global_batch_size)})
            self.point(f"grpo_{name}_{k}", str(out / "hf"), local)


def _sft_tokens(run_dir: Path) -> int:
    """Loss tokens over an SFT run's logged steps (a step logged twice after a restart counts once)."""
    by_step = {r["step"]: r.get("sft/loss_tokens", 0) for r in read_metrics(run_dir / "metrics_sft.jsonl")}
    return int(sum(by_step.values()))


def _grpo_tokens(run_dir: Path, upto: int, batch: int) -> int:
    """Response tokens sampled over GRPO's logged steps up to `upto` (mean length x the step's batch; each step
    counted once): what the learner trains on besides the prompts."""
    by_step = {r["step"]: r.get("rollout/response_tokens_mean", 0) * batch
               for r in read_metrics(run_dir / "metrics_grpo.jsonl") if 0 < r["step"] <= upto}
    return int(sum(by_step.values()))


def _model_of(point: str) -> str:
    """The model folder (relative to the workspace) of an SFT point: `sft` -> sft/hf, `sft+K` -> its cycle's."""
    return "sft/hf" if point == "sft" else f"sft_more/cycle_{point.split('+', 1)[1]}/hf"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def table(root: Path) -> dict:
    """Every evaluated point with its cumulative cost from the starting SFT. `clean_s_after_sft` is steps x the
    median seconds per step of that curve's own chunks (SFT cycles; each GRPO curve's chunks), so one chunk slowed by
    other work beside it does not bend the axis; the starting SFT's own cost on this machine is estimated the same
    way (`start.clean_seconds_here`: its steps x the SFT cycles' median)."""
    root = root.resolve()
    start = _load(root / "sft" / "hf" / "done.json")
    exact = {p.name: _load(p / "metrics.json") for p in sorted((root / "points").glob("*"))
             if (p / "metrics.json").exists()}

    def row(name: str, kind: str, steps: int, wall: float, tokens: int, rate: float | None) -> dict:
        m = exact[name]
        return {"name": name, "kind": kind, "steps_after_sft": steps, "wall_s_after_sft": round(wall, 1),
                "learner_tokens_after_sft": tokens,
                "clean_s_after_sft": round(steps * rate, 1) if rate is not None else None,
                "exact": m.get("exact_match"), "kappa": m.get("type_kappa"),
                "exact_non_terminate": m.get("exact_match_non_terminate"), "n": m.get("n")}

    cycles = []
    for k in range(1, 10_000):
        done = root / "sft_more" / f"cycle_{k}" / "hf" / "done.json"
        if not done.exists() or f"sft+{k}" not in exact:
            break
        cycles.append(_load(done))
    sft_rate = _median([d["seconds"] / d["steps"] for d in cycles])
    rows = [row("sft", "sft", 0, 0.0, 0, sft_rate)] if "sft" in exact else []
    steps = wall = tokens = 0
    for k, d in enumerate(cycles, 1):
        steps, wall, tokens = steps + d["steps"], wall + d["seconds"], tokens + d.get("loss_tokens", 0)
        rows.append(row(f"sft+{k}", "sft_continued", steps, wall, tokens, sft_rate))
    grpo_rates = {}
    for base in sorted(root.glob("grpo_*")):
        name = base.name[len("grpo_"):]
        origin = Path(_load(base / "start.json")["start"])
        origin = str(origin.relative_to(root)) if origin.is_relative_to(root) else str(origin)
        chunks = []
        for k in range(1, 10_000):
            done = base / f"chunk_{k}" / "done.json"
            if not done.exists() or f"grpo_{name}_{k}" not in exact:
                break
            chunks.append(_load(done))
        rate = _median([d["seconds"] / (d["steps"] - (chunks[i - 1]["steps"] if i else 0))
                        for i, d in enumerate(chunks)])
        grpo_rates[name] = rate
        # A curve from an SFT cycle starts where that cycle ended: its cost so far is the cycles' (the x-axis is
        # compute since the starting SFT); `grpo_steps` counts GRPO's own.
        at = next((r for r in rows if r["kind"] in ("sft", "sft_continued") and _model_of(r["name"]) == origin),
                  None)
        base_steps, base_wall, base_tokens = ((at["steps_after_sft"], at["wall_s_after_sft"],
                                               at["learner_tokens_after_sft"]) if at else (0, 0.0, 0))
        base_clean = (at["clean_s_after_sft"] or 0.0) if at else 0.0

        points = [(f"grpo_{name}_0", 0, 0.0, 0)] if f"grpo_{name}_0" in exact else []
        wall = 0.0
        for k, d in enumerate(chunks, 1):
            wall += d["seconds"]
            points.append((f"grpo_{name}_{k}", d["steps"], wall, d.get("learner_tokens", 0)))
        for point, steps, spent, tokens in points:
            r = row(point, f"grpo_{name}", base_steps + steps, base_wall + spent, base_tokens + tokens, None)
            r["clean_s_after_sft"] = round(base_clean + steps * rate, 1) if rate is not None else None
            rows.append(r | {"from": origin, "grpo_steps": steps})
    start = start | {"clean_seconds_here": round(start["steps"] * sft_rate, 1) if sft_rate else None}
    return {"start": start, "sft_seconds_per_step": sft_rate, "grpo_seconds_per_step": grpo_rates, "rows": rows}


def plateau_cycle(exact: list[float], window: int = 2, tol: float = 0.01) -> int | None:
    """The SFT cycle from which more SFT adds nothing, in hindsight: the first k (exact[0] the starting SFT, one
    cycle an epoch) with at least `window` cycles after it, none of which beats the best exact up to k by more than
    `tol` (issue 47: validation exact flat over its last two epochs, and not rising after). None while it still
    rises. One evaluation's standard error here is ~2.3 points (n = 447): a single flat pair followed by a rise is
    noise, not a plateau, which is why every later cycle is checked, not only the next two."""
    for k in range(len(exact) - window):
        if max(exact[k + 1:]) <= max(exact[:k + 1]) + tol:
            return k
    return None


def plot(data: dict, out: Path) -> None:
    """Validation exact (left) and the action type's κ (right) against clean seconds after the starting SFT: SFT
    continued and every GRPO curve, drawn from the point it started at, with the SFT stage itself to the left of 0
    (its start is the from-scratch model, 0 % exact; only its end is evaluated)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    start = data["start"]
    kinds: dict[str, list[dict]] = {}
    for r in data["rows"]:
        kinds.setdefault(r["kind"], []).append(r)
    sft_rows = kinds.pop("sft", [])
    cycle = [r["steps_after_sft"] for r in kinds.get("sft_continued", [])[:1]]
    for ax, key, scale, name in ((axes[0], "exact", 100, "validation exact match (%)"),
                                 (axes[1], "kappa", 1, "validation κ of the action type")):
        if sft_rows:
            ax.plot([-(start.get("clean_seconds_here") or start["seconds"]), 0], [0, scale * sft_rows[0][key]], ":",
                    color="grey", label=f"SFT stage ({start['steps']} steps; only its end evaluated)")
        for kind, rows in sorted(kinds.items()):
            if kind == "sft_continued" and sft_rows:
                rows = sft_rows + rows
            origin = rows[0].get("from", "?").removesuffix("/hf")
            origin = "sft+" + origin.rsplit("_", 1)[1] if origin.startswith("sft_more/cycle_") else origin
            label = (f"SFT continued (cosine cycles of {cycle[0]} steps)" if cycle else "SFT continued") \
                if kind == "sft_continued" else f"GRPO from {origin.removesuffix('/hf')}"
            ax.plot([r["clean_s_after_sft"] or r["wall_s_after_sft"] for r in rows],
                    [scale * (r[key] or 0) for r in rows], "o-", ms=3, label=label)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_xlabel("seconds after the starting SFT (steps x the curve's median s/step, this machine)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def compare_points(root: Path, names: list[str], reference: str) -> str:
    """The named points side by side on the validation split with the trivial baselines (fitted on rl_train), κ,
    exact on non-terminate targets and session-resampled intervals, each paired against `reference`."""
    from shop_r1.comparison import Setting, baseline_settings, compare, format_comparison
    from shop_r1.metrics import load_predictions

    root = root.resolve()
    missing = [n for n in names if not _predictions(root / "points" / n).exists()]
    if missing:
        raise SystemExit(f"{root}/points: no evaluated point {', '.join(missing)}")
    settings = [Setting(n, "model", load_predictions(_predictions(root / "points" / n)), name=n) for n in names]
    if (root / "data" / "rl_train.jsonl").exists():
        settings += baseline_settings(root / "data" / "rl_train.jsonl", root / "data" / "rl_val.jsonl")
    else:  # an export: the baselines were scored into it
        for b in sorted((root / "baselines").glob("*")):
            about = _load(b / "about.json")
            settings.append(Setting(about["label"], "baseline", load_predictions(_predictions(b)), note=about["note"],
                                    name=b.name))
    return format_comparison(compare(settings, reference=reference))


def _predictions(point: Path) -> Path:
    plain = point / "predictions.jsonl"
    return plain if plain.exists() else point / "predictions.jsonl.gz"


EXPORTED = ("config.yaml", "sft/hf/done.json", "sft_more/cycle_*/hf/done.json", "grpo_*/start.json",
            "grpo_*/chunk_*/done.json", "points/*/metrics.json", "points/*/metrics.txt", "points/*/headroom.json")


def export(root: Path, to: Path) -> list[Path]:
    """The workspace's results without its models and data, small enough to commit, in the same layout (so `table`
    and `compare` read the export as they read the workspace): the costs (done.json, start.json), every point's
    metrics and its predictions (gzipped), and the trivial baselines' predictions on the validation split (fitted
    on rl_train) under baselines/, which `compare` reads in place of the data. Returns the files written."""
    import gzip

    from shop_r1.comparison import baseline_settings
    from shop_r1.metrics import write_predictions

    root, to = root.resolve(), to.resolve()
    written = []
    for pattern in EXPORTED:
        for src in sorted(root.glob(pattern)):
            dst = to / src.relative_to(root)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.name == "start.json":  # a GRPO curve's start, named inside the workspace: relative in the export
                start = Path(_load(src)["start"])
                _mark(dst, {"start": str(start.relative_to(root)) if start.is_relative_to(root) else str(start)})
            else:
                shutil.copyfile(src, dst)
            written.append(dst)
    def gz(src: Path, dst: Path) -> None:  # mtime 0: the same bytes on a re-export
        with src.open("rb") as f, dst.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as g:
            shutil.copyfileobj(f, g)

    for src in sorted(root.glob("points/*/predictions.jsonl")):
        dst = to / src.relative_to(root).with_suffix(".jsonl.gz")
        gz(src, dst)
        written.append(dst)
    for b in baseline_settings(root / "data" / "rl_train.jsonl", root / "data" / "rl_val.jsonl"):
        plain = to / "baselines" / b.name / "predictions.jsonl"
        plain.parent.mkdir(parents=True, exist_ok=True)
        write_predictions(b.predictions, plain)
        gz(plain, plain.with_suffix(".jsonl.gz"))
        plain.unlink()
        _mark(plain.parent / "about.json", {"label": b.label, "note": b.note})
        written += [plain.with_suffix(".jsonl.gz"), plain.parent / "about.json"]
    return written


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="the workspace (resumable)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="the base config (default: the main job's)")
    p.add_argument("--sft-model", default="", help="the starting SFT model's folder (copied into the workspace); "
                   "without it `sft` trains the config's SFT stage first")
    p.add_argument("--sft-steps", type=int, default=544, help="its SFT stage's optimizer steps")
    p.add_argument("--sft-seconds", type=float, default=1074.2,
                   help="its SFT stage's wall seconds where it was made (recorded; the figure uses this machine's)")
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sft", help="SFT cycles after the starting model, each evaluated on validation")
    s.add_argument("--cycles", type=int, required=True)
    s.add_argument("--cycle-steps", type=int, default=136, help="optimizer steps per cycle (default: one epoch)")
    g = sub.add_parser("grpo", help="GRPO from a starting point, evaluated every chunk")
    g.add_argument("--chunks", type=int, required=True)
    g.add_argument("--chunk-steps", type=int, default=100)
    g.add_argument("--from", dest="origin", default="sft", help="`sft` or `sft+K` (an SFT cycle's model)")
    g.add_argument("--name", default=None, help="the curve's name (default: the --from value)")
    t = sub.add_parser("table", help="the points with their costs, as JSON (and a figure with --plot)")
    t.add_argument("--out", default=None)
    t.add_argument("--plot", default=None, help="write the curves' figure (PNG) here")
    c = sub.add_parser("compare", help="points side by side with the baselines and paired session-resampled intervals")
    c.add_argument("points", nargs="+", help="point names (root/points/NAME), the first is the reference")
    e = sub.add_parser("export", help="the results without models or data, to commit (table and compare read it)")
    e.add_argument("--to", required=True, help="the export folder")
    return p


def _table_command(root: Path, out_path: str | None, plot_path: str | None) -> int:
    out = table(root)
    sft_curve = [r["exact"] for r in out["rows"] if r["kind"] in ("sft", "sft_continued")]
    out["sft_plateau_cycle"] = plateau_cycle(sft_curve)
    if plot_path:
        plot(out, Path(plot_path))
    text = json.dumps(out, indent=2)
    if out_path:
        write_atomic(Path(out_path), text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, overrides = p.parse_known_args(argv)  # what is left: dotted config overrides for every stage
    if args.what == "compare":
        print(compare_points(Path(args.root), args.points, reference=args.points[0]))
        return 0
    if args.what == "export":
        print(f"{len(export(Path(args.root), Path(args.to)))} files written to {args.to}")
        return 0
    if args.what == "table":
        return _table_command(Path(args.root), args.out, args.plot)
    if args.what == "grpo" and not args.sft_model and not (Path(args.root) / "sft" / "hf" / "done.json").exists():
        p.error("--sft-model, or `sft` first: GRPO needs the starting SFT model")
    bad = [o for o in overrides if "=" not in o or o.startswith("-")]
    if bad:
        p.error(f"not a dotted config override (KEY=VALUE): {' '.join(bad)}")
    curves = Curves(Path(args.root), Path(args.config), overrides, Path(args.sft_model) if args.sft_model else None,
                    args.sft_steps, args.sft_seconds)
    from shop_r1.distributed.runtime import start_ray

    curves.data()
    runtime = start_ray(curves.cfg.ray)
    try:
        if args.what == "sft":
            curves.sft_cycles(args.cycles, args.cycle_steps, runtime.local_mode)
        else:
            k = 0 if args.origin == "sft" else int(args.origin.split("+", 1)[1])
            curves.grpo_chunks(args.name or args.origin.replace("+", "_"), curves.cycle_model(k), args.chunks,
                               args.chunk_steps, runtime.local_mode)
    finally:
        runtime.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
