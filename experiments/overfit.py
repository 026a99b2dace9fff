"""The RL overfit check (issue 45): can GRPO teach the SFT model a handful of its own training prompts?

    source scripts/env.sh
    .venv/bin/python experiments/overfit.py --model RUN/sft/hf --examples RUN/data/rl_train.jsonl --out DIR \
        [--num-prompts 16] [--seed 0] [--config configs/demo_cpu.yaml] [dotted.overrides for shop-r1 train ...]
    (or: .venv/bin/python -m experiments.overfit ...)

With so few prompts and enough steps, a GRPO loop that works drives the share of exact samples up and the greedy
answers to the targets; one that does not (a reward that does not reach the update, a weight sync that does not
reach the engines) leaves both flat. Stages, each skipped when its output is complete, so a killed run is rerun
with the same command (a different command in the same DIR is refused):

    prompts  DIR/prompts.jsonl        N distinct examples of --examples, a seeded sample (deterministic), file order
    before   DIR/before/metrics.json  `shop-r1 eval run`, greedy, of the SFT model on those N prompts
    train    DIR/train/done.json      `shop-r1 train` on those N prompts, run_dir DIR/train (the model:
                                      DIR/train/grpo/hf); after a kill it is rerun with --resume from its checkpoint
    after    DIR/after/metrics.json   `shop-r1 eval run`, greedy, of the trained model on the same N prompts
    curve    DIR/curve.json           per GRPO step the share of the step's samples that are an exact match, the mean
                                      of the first and last 10 steps, and greedy exact before -> after, "k of N"

Sample exact is recomputed from the rollout dump (DIR/train/rollouts.jsonl: every sample's text, scored against its
prompt's target by the evaluation's exact-match rule), so it means the same under every reward; the logged
`reward/action_type` (metrics_grpo.jsonl) is shown beside it, which under `reward.action_reward=binary` is the same
share. The trailing overrides go to `shop-r1 train` and to both evaluations (one config for all three); the check
sets run_dir, eval.temperature=0 and eval.max_examples=0 itself, and defaults rl.val_every=0 (`shop-r1 train` has no
validation split) and logging.wandb=false. A bad input or a failed stage ends with one line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shop_r1.atomic import write_atomic  # noqa: E402
from shop_r1.cli import USER_ERRORS, one_line  # noqa: E402
from shop_r1.data.examples import load_rl_examples, write_examples_jsonl  # noqa: E402
from shop_r1.data.jsonl import read_jsonl  # noqa: E402
from shop_r1.errors import DataError, UserError  # noqa: E402
from shop_r1.metrics import load_predictions  # noqa: E402
from shop_r1.reward.action import exact_match  # noqa: E402
from shop_r1.reward.format import parse_response  # noqa: E402
from shop_r1.tracking import read_metrics  # noqa: E402
from shop_r1.types import Action, RLExample  # noqa: E402

DEFAULT_CONFIG = ROOT / "configs" / "demo_cpu.yaml"
WINDOW = 10
"""Steps at each end of the curve whose mean is reported."""
DEFAULTS = ("rl.val_every=0", "logging.wandb=false")
"""Before the user's overrides (they may change them): `shop-r1 train` takes no validation prompts, and a check this
small needs no wandb run."""
SET_HERE = ("run_dir", "eval.temperature", "eval.max_examples")
"""Keys the check sets after the user's overrides, so an override of them is refused: the stages' folders, and
greedy decoding of all N prompts."""
REQUEST_FILE = "overfit.json"
LOGGED_KEY = "reward/action_type"


def _exact(response: str, target: Action) -> bool:
    """The evaluation's rule (shop_r1.metrics): an unparseable response is wrong."""
    parsed = parse_response(response)
    return exact_match(parsed.action if parsed is not None else None, target)


def choose_examples(examples: Sequence[RLExample], n: int, seed: int, where: str) -> list[RLExample]:
    """N distinct examples (by example_id: `data build`'s balancing repeats some), drawn with `seed`, in file order.
    Fewer than N distinct examples is a DataError naming `where`."""
    if n < 1:
        raise UserError(f"--num-prompts {n}: must be at least 1")
    first: dict[str, RLExample] = {}
    for e in examples:
        first.setdefault(e.example_id, e)
    distinct = list(first.values())
    if len(distinct) < n:
        raise DataError(f"{where}: {len(distinct)} distinct examples ({len(examples)} lines), fewer than "
                        f"--num-prompts {n}")
    picked = sorted(random.Random(seed).sample(range(len(distinct)), n))
    return [distinct[i] for i in picked]


@dataclass(frozen=True)
class GreedyExact:
    """Greedy answers that are an exact match of their target, of the N prompts."""

    exact: int
    n: int

    def render(self) -> str:
        return f"{self.exact} of {self.n}"


def greedy_exact(predictions_path: str | Path, example_ids: Sequence[str]) -> GreedyExact:
    """Count the exact matches in an `eval run`'s predictions.jsonl, which must hold exactly `example_ids` (in any
    order): predictions of other prompts, or of a cut-short evaluation, are a DataError naming the file."""
    preds = load_predictions(predictions_path)
    if sorted(preds.example_ids) != sorted(example_ids):
        raise DataError(f"{predictions_path}: holds {len(preds.example_ids)} predictions, not one for each of the "
                        f"{len(example_ids)} prompts (another run's, or cut short): remove its folder to evaluate "
                        "again")
    return GreedyExact(sum(_exact(r, t) for r, t in zip(preds.responses, preds.targets)), len(example_ids))


@dataclass(frozen=True)
class SampleExact:
    """The rollout dump read back: per step, how many of its samples are exact."""

    exact: dict[int, int]
    samples: dict[int, int]
    unreadable_lines: int
    """Lines that are not JSON, skipped: a line cut by a kill, which the resumed run appended to."""


def _groups_by_step(rollouts_path: str | Path, targets: Mapping[str, Action]
                    ) -> tuple[dict[int, list[tuple[str, int, int]]], int]:
    """The rollout dump's groups, in file order per step, as (example id, exact samples, samples), and how many lines
    were not JSON (skipped). A group of another prompt, or without an integer step, is a DataError naming its line."""
    by_step: dict[int, list[tuple[str, int, int]]] = {}
    unreadable = 0
    for row in read_jsonl(rollouts_path):
        if row.error is not None or not isinstance(row.value, dict):
            unreadable += 1
            continue
        step, eid = row.value.get("step"), row.value.get("example_id")
        if type(step) is not int or eid not in targets:
            raise DataError(f"{row.where}: expected a group of the prompts' examples with an integer step (got "
                            f"step {step!r}, example {eid!r})")
        texts = [s.get("text") for s in row.value.get("samples", [])]
        exact = sum(isinstance(t, str) and _exact(t, targets[eid]) for t in texts)
        by_step.setdefault(step, []).append((eid, exact, len(texts)))
    return by_step, unreadable


def sample_exact_by_step(rollouts_path: str | Path, targets: Mapping[str, Action], groups_per_step: int
                         ) -> SampleExact:
    """Per step of a `shop-r1 train` rollout dump (one line per group, shop_r1/rollout/records.py), the samples that
    are an exact match of their prompt's target (`targets`, by example id). A resumed run appends the steps after its
    checkpoint again, so of each step only its last `groups_per_step` lines (P: the last attempt's) count, as the
    metrics readers keep the last record of a step."""
    by_step, unreadable = _groups_by_step(rollouts_path, targets)
    last = {step: [(e, n) for _, e, n in g[-groups_per_step:]] for step, g in by_step.items()}
    return SampleExact({s: sum(e for e, _ in g) for s, g in last.items()},
                       {s: sum(n for _, n in g) for s, g in last.items()}, unreadable)


@dataclass(frozen=True)
class PromptVisits:
    """Per prompt (example id), each visit's (step, exact samples, samples), in step order: what a group of G
    samples found on that prompt then."""

    visits: dict[str, list[tuple[int, int, int]]]

    def headroom(self) -> dict[str, int]:
        """How many prompts: had an exact sample in their first group (pass@G of the starting policy, as far as the
        first visit shows it), had one in any group, were exact in every sample of their last group."""
        first = sum(v[0][1] > 0 for v in self.visits.values() if v)
        ever = sum(any(e > 0 for _, e, _ in v) for v in self.visits.values())
        last_all = sum(v[-1][1] == v[-1][2] > 0 for v in self.visits.values() if v)
        return {"prompts": len(self.visits), "exact_in_first_group": first, "exact_in_any_group": ever,
                "all_exact_in_last_group": last_all}


def prompt_visits(rollouts_path: str | Path, targets: Mapping[str, Action], groups_per_step: int) -> PromptVisits:
    """The rollout dump's groups by prompt (a resumed run's repeated steps: the last attempt's groups, as
    `sample_exact_by_step`)."""
    by_step, _ = _groups_by_step(rollouts_path, targets)
    visits: dict[str, list[tuple[int, int, int]]] = {eid: [] for eid in targets}
    for step in sorted(by_step):
        for eid, exact, n in by_step[step][-groups_per_step:]:
            visits[eid].append((step, exact, n))
    return PromptVisits(visits)


@dataclass(frozen=True)
class CurvePoint:
    step: int
    sample_exact: float
    """Share of the step's P x G samples that are an exact match of their target."""
    num_samples: int
    reward_action_type: float | None
    """The step's logged mean of reward/action_type (None when metrics_grpo.jsonl has no such record of the step)."""


def curve_points(counts: SampleExact, metrics: Iterable[Mapping[str, float]]) -> list[CurvePoint]:
    """One point per step of the rollout dump, with the logged reward/action_type of the same step beside it."""
    logged = {int(r["step"]): float(r[LOGGED_KEY]) for r in metrics if LOGGED_KEY in r}
    return [CurvePoint(s, counts.exact[s] / counts.samples[s] if counts.samples[s] else 0.0, counts.samples[s],
                       logged.get(s)) for s in sorted(counts.samples)]


@dataclass(frozen=True)
class WindowMeans:
    first: float
    """Mean of the first min(window, n) values."""
    last: float
    """Mean of the last min(window, n) values (the windows overlap when n < 2 * window)."""
    window: int
    n: int


def window_means(values: Sequence[float], window: int = WINDOW) -> WindowMeans:
    if not values:
        raise DataError("no GRPO steps to summarize")
    k = min(window, len(values))
    return WindowMeans(sum(values[:k]) / k, sum(values[-k:]) / k, window, len(values))


def curve_summary(points: Sequence[CurvePoint], before: GreedyExact, after: GreedyExact,
                  window: int = WINDOW) -> dict:
    """What DIR/curve.json holds: the window means of sample exact (and of the logged reward/action_type, when
    every step has it), greedy exact before and after, and every step's point."""
    logged = [p.reward_action_type for p in points]
    return {"sample_exact": asdict(window_means([p.sample_exact for p in points], window)),
            LOGGED_KEY: asdict(window_means(logged, window)) if None not in logged else None,
            "greedy_exact": {"before": asdict(before), "after": asdict(after)},
            "steps": [asdict(p) for p in points]}


def render(summary: dict) -> str:
    s, g = summary["sample_exact"], summary["greedy_exact"]
    lines = [f"{'step':>5}  {'sample exact':>12}  {LOGGED_KEY:>18}  samples"]
    for p in summary["steps"]:
        logged = "-" if p["reward_action_type"] is None else f"{p['reward_action_type']:.3f}"
        lines.append(f"{p['step']:>5}  {p['sample_exact']:>12.3f}  {logged:>18}  {p['num_samples']:>7}")
    k = min(s["window"], s["n"])
    lines.append(f"sample exact: first {k} steps {s['first']:.3f}, last {k} steps {s['last']:.3f} ({s['n']} steps)")
    if summary[LOGGED_KEY] is not None:
        w = summary[LOGGED_KEY]
        lines.append(f"{LOGGED_KEY} (logged): first {k} steps {w['first']:.3f}, last {k} steps {w['last']:.3f}")
    before, after = GreedyExact(**g["before"]), GreedyExact(**g["after"])
    lines.append(f"greedy exact: before {before.render()}, after {after.render()}")
    for name in ("before", "after"):
        h = summary.get(f"pass_at_k_{name}")
        if h:
            lines.append(f"{name}, {h['n']} prompts: pass@1 {h['pass_at_1']:.3f}, "
                         f"sample exact {h['sample_exact']:.3f}, "
                         f"pass@k {h['pass_at_k']:.3f} (eval run's samples at rollout.temperature)")
    if summary.get("headroom"):
        h = summary["headroom"]
        lines.append(f"prompts with an exact sample: in their first group {h['exact_in_first_group']}, in any group "
                     f"{h['exact_in_any_group']}; all samples exact in their last group "
                     f"{h['all_exact_in_last_group']} (of {h['prompts']})")
    return "\n".join(lines)


def request_changes(saved: Mapping[str, object], now: Mapping[str, object]) -> list[str]:
    """`key: saved -> now` for every argument of the command that differs from the one DIR was made with."""
    return [f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
            if saved.get(k) != now.get(k)]


def check_overrides(config: Path, overrides: Sequence[str]) -> None:
    """The overrides resolve on `config` as the stages will resolve them (the config's rules: a ConfigError naming the
    key), and none sets a key the check sets itself."""
    from shop_r1.config import load_config

    load_config(config, [*DEFAULTS, *overrides])
    for o in overrides:
        if o.split("=", 1)[0].strip() in SET_HERE:
            raise UserError(f"{o!r}: the overfit check sets {', '.join(SET_HERE)} itself")


class StageFailed(UserError):
    """A `shop-r1` subprocess exited non-zero; its own message is above."""


def run_shop_r1(stage: str, args: Sequence[str]) -> None:
    """Run `shop-r1 ARGS` with this interpreter and this checkout's code, its output on this console."""
    print(f"==> {stage}: shop-r1 {shlex.join(args)}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    start = time.perf_counter()
    rc = subprocess.run([sys.executable, "-m", "shop_r1.cli", *args], env=env, check=False).returncode
    if rc:
        raise StageFailed(f"stage {stage}: `shop-r1 {' '.join(args[:2])} ...` exited with status {rc} (its own "
                          "message is above); rerun the same command to continue")
    print(f"<== {stage}: {time.perf_counter() - start:.0f}s", flush=True)


@dataclass(frozen=True)
class Check:
    """One overfit check's inputs and folders."""

    model: Path
    examples: Path
    num_prompts: int
    seed: int
    config: Path
    overrides: tuple[str, ...]
    out: Path

    @property
    def prompts(self) -> Path:
        return self.out / "prompts.jsonl"

    @property
    def train_dir(self) -> Path:
        return self.out / "train"

    @property
    def trained_model(self) -> Path:
        return self.train_dir / "grpo" / "hf"  # `shop-r1 train`'s default --out-dir is RUN_DIR/grpo

    def request(self) -> dict[str, object]:
        return {"model": str(self.model), "examples": str(self.examples), "num_prompts": self.num_prompts,
                "seed": self.seed, "config": str(self.config), "overrides": list(self.overrides)}

    def config_args(self, run_dir: Path, *forced: str) -> list[str]:
        return ["--config", str(self.config), *DEFAULTS, *self.overrides, f"run_dir={run_dir}", *forced]


def check_inputs(c: Check) -> None:
    """The inputs exist, and DIR, if a run there got past its prompts, was made by this same command."""
    from shop_r1.models.hub import missing_files

    if not c.model.is_dir():
        raise UserError(f"--model {c.model}: no such folder")
    missing = missing_files(c.model)
    if missing:
        raise UserError(f"--model {c.model}: not a model folder (lacks {', '.join(missing)})")
    if not c.examples.is_file():
        raise UserError(f"--examples {c.examples}: no such file")
    if not c.config.is_file():
        raise UserError(f"--config {c.config}: no such file")
    check_overrides(c.config, c.overrides)
    saved = c.out / REQUEST_FILE
    if saved.exists():
        changes = request_changes(json.loads(saved.read_text()), c.request())
        if changes:
            raise UserError(f"{c.out} was made by another command ({'; '.join(changes)}): give another --out, or "
                            "remove the folder to start again")


def prompts_stage(c: Check) -> list[RLExample]:
    chosen = choose_examples(load_rl_examples(c.examples), c.num_prompts, c.seed, str(c.examples))
    if c.prompts.exists():
        if [e.example_id for e in load_rl_examples(c.prompts)] != [e.example_id for e in chosen]:
            raise DataError(f"{c.prompts}: holds other examples than --examples/--seed/--num-prompts choose: remove "
                            "it (and the stages after it) to start again")
        print(f"==> prompts: {c.prompts} (done)", flush=True)
    else:
        write_examples_jsonl(chosen, c.prompts)
        print(f"==> prompts: {len(chosen)} of {c.examples} (seed {c.seed}) -> {c.prompts}", flush=True)
    # Recorded once the inputs are known good (a first attempt with a bad input does not bind the folder), before
    # any stage that a different command would make differently.
    write_atomic(c.out / REQUEST_FILE, json.dumps(c.request(), indent=2))
    return chosen


def eval_stage(c: Check, name: str, model: Path, ids: Sequence[str]) -> GreedyExact:
    out = c.out / name
    if not (out / "metrics.json").exists():  # written after predictions.jsonl: present means complete
        run_shop_r1(name, ["eval", "run", "--model", str(model), "--examples", str(c.prompts), "--out-dir",
                           str(out), "--label", name,
                           *c.config_args(c.out, "eval.temperature=0", "eval.max_examples=0")])
    else:
        print(f"==> {name}: {out} (done)", flush=True)
    return greedy_exact(out / "predictions.jsonl", ids)


def train_stage(c: Check) -> Path:
    from shop_r1 import checkpoint

    done = c.train_dir / "done.json"
    if done.exists():
        print(f"==> train: {c.trained_model} (done)", flush=True)
        return c.trained_model
    resume = checkpoint.latest(c.trained_model.parent / "checkpoints") is not None
    run_shop_r1("train", ["train", "--model", str(c.model), "--examples", str(c.prompts), *(["--resume"] * resume),
                          *c.config_args(c.train_dir)])
    write_atomic(done, json.dumps({"model": str(c.trained_model), "resumed": resume}, indent=2))
    return c.trained_model


def prompts_per_step(train_dir: Path) -> int:
    """P, the prompts of one GRPO step, by the train run's own config.yaml (as shop_r1/train.py's sampler)."""
    from shop_r1.config import load_config

    cfg = load_config(train_dir / "config.yaml")
    return max(1, cfg.rl.global_batch_size // cfg.rollout.group_size)


def run_check(c: Check) -> dict:
    check_inputs(c)
    chosen = prompts_stage(c)
    ids = [e.example_id for e in chosen]
    before = eval_stage(c, "before", c.model, ids)
    after = eval_stage(c, "after", train_stage(c), ids)
    counts = sample_exact_by_step(c.train_dir / "rollouts.jsonl", {e.example_id: e.target for e in chosen},
                                  prompts_per_step(c.train_dir))
    if counts.unreadable_lines:
        print(f"note: {counts.unreadable_lines} unreadable line(s) of {c.train_dir / 'rollouts.jsonl'} skipped (a "
              "write cut by a kill)", flush=True)
    visits = prompt_visits(c.train_dir / "rollouts.jsonl", {e.example_id: e.target for e in chosen},
                           prompts_per_step(c.train_dir))
    summary = {"sample_exact_source": "rollouts.jsonl: each sample's text vs its target, exact_match",
               "num_prompts": c.num_prompts, "headroom": visits.headroom(),
               **curve_summary(curve_points(counts, read_metrics(c.train_dir / "metrics_grpo.jsonl")), before, after),
               "visits": {eid: [list(v) for v in vs] for eid, vs in visits.visits.items()}}
    for name in ("before", "after"):  # `eval run`'s own samples (eval.headroom_examples): pass@k of the N prompts
        path = c.out / name / "headroom.json"
        summary[f"pass_at_k_{name}"] = json.loads(path.read_text())["overall"] if path.exists() else None
    write_atomic(c.out / "curve.json", json.dumps(summary, indent=2))
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, type=Path, help="the SFT model folder (a pipeline run's sft/hf)")
    p.add_argument("--examples", required=True, type=Path,
                   help="RL training examples (rl_train.jsonl of `shop-r1 data build` or a pipeline run's data/)")
    p.add_argument("--num-prompts", type=int, default=16, help="how many distinct examples to train on (default 16)")
    p.add_argument("--seed", type=int, default=0, help="which examples: the seed of their sample (default 0)")
    p.add_argument("--out", required=True, type=Path, help="the check's folder (resumable)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the config of train and both evaluations")
    p.add_argument("overrides", nargs="*", help="dotted overrides for shop-r1 train, e.g. rl.steps=100 "
                                                "reward.action_reward=binary rl.lr=5e-4")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_intermixed_args(argv)
    check = Check(args.model.resolve(), args.examples.resolve(), args.num_prompts, args.seed, args.config.resolve(),
                  tuple(args.overrides), args.out.resolve())
    try:
        summary = run_check(check)
    except USER_ERRORS as e:
        print(f"overfit: error: {one_line(e)}", file=sys.stderr, flush=True)
        return 2
    print(render(summary), flush=True)
    print(f"curve: {check.out / 'curve.json'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
