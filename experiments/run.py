"""Reproduce the paper's trends on this machine, one suite at a time, resumable stage by stage.

    python experiments/run.py table2 [--root runs/experiments] [--results experiments/results] [dotted.overrides ...]
    python experiments/run.py v2_table2 [dotted.overrides ...] [--seeds 0 1 2] [--config configs/demo_cpu.yaml]
    (or: bash experiments/run.sh SUITE ..., which sets up .venv and the environment first; overrides go before
    --seeds, or after `--`)

Suites on the paper-setting shop (experiments/configs/base.yaml, data.synth_version=1; one workspace, one seed; rows
share the data, the model and the SFT stage; each row is one GRPO run from the SFT model + one eval):
    table2  zero-shot, SFT, SFT + RL (binary reward), SFT + Shop-R1                          (paper Table 2)
    table4  Shop-R1 without format / rationale reward / reward scale, binary action reward   (paper Table 4)
    fig2    Shop-R1 at RL sampling temperatures 0.2 .. 1.0                                   (paper Figure 2)
    vocab   Shop-R1 with and without Eq. 3's division of s(r) by |V|
    seeds   Shop-R1 with GRPO seeds 1 and 2 beside the default run (how much of a row is the seed)
    table5  SFT and Shop-R1 with whole-session context (a second data/SFT workspace)         (paper Table 5)

Suites on the profiled shop (issue 21, section 5): the main job's config (configs/demo_cpu.yaml, everything tuned
there; its profiled shop, data.synth_version 2-4) with eval.split=test and logging.wandb=false forced,
over seeds (default 0 1 2): seed k
is its own workspace ROOT/v2/seed<k> with `seed=k data.synth_seed=k` (its own data, model, SFT and RL runs), shared
by the three v2 suites (Shop-R1 and SFT are trained once per seed):
    v2_table2  zero-shot, SFT, SFT continued for the Shop-R1 GRPO stage's wall time, SFT + RL (binary), SFT + Shop-R1
    v2_table4  SFT, the paper's four ablations, reward.click_guard=true, rl.self_certainty_breaks_ties=false,
               rl.scale_rewards=none, Shop-R1 (a switch the base config already sets is measured the other way)
    v2_fig2    SFT and Shop-R1 at RL sampling temperatures 0.2 .. 1.0 (the base temperature's row is the Shop-R1 run)
    v2_regime  SFT, SFT continued for the Shop-R1 GRPO stage's wall time, SFT + Shop-R1: one regime of issue 47 (its
               overrides, e.g. data.rationale_fraction=0.2, on the command line) on untuned seeds

Stages and what marks them done (a finished stage is never redone; GRPO resumes from its last checkpoint):
    data   WS/data/stats.json           model  WS/model/shop_lm/shop_r1_model.json
    sft    WS/sft/hf/done.json          rl     WS/rl/NAME/done.json        eval   WS/eval/NAME/metrics.json
    sft_continued  WS/sft_continued/hf/done.json (after WS/rl/shop_r1: its length is that stage's wall time)
Stage wall times go to WS/stage_seconds.json. A v2 workspace refuses a config other than the one it was made with.
`--adopt K=RUN_DIR` seeds workspace K from a finished main-job run of the same config (data, model, SFT, Shop-R1).
`--carry RESULTS_DIR` adds the seeds of an earlier summary of the suite (made with the same config, e.g. committed by
another session) to the table, from its committed predictions: a 3-seed table can be run one seed at a time.
Results: RESULTS/<machine>/<suite>/ results.json, table.md, predictions/ and PNG plots (experiments/summarize.py;
v2 suites: mean +- SD over the seeds beside each seed's own table). The test split is never used for any choice.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.same_config import (  # noqa: E402
    check_carry,
    config_changes,
    seed_overrides,
    with_overrides,
)
from experiments.suites import (  # noqa: E402
    ALIASES,
    SHOP_R1,
    SUITES,
    V2_SEEDS,
    V2_SUITES,
    Row,
    seed_workspace,
    v2_suite,
)
from experiments.summarize import carried_seeds, summarize, summarize_seeds  # noqa: E402
from shop_r1.atomic import write_atomic  # noqa: E402
from shop_r1.config import Config, ConfigError, load_config, save_config  # noqa: E402

BASE_CONFIG = ROOT / "experiments" / "configs" / "base.yaml"
V2_BASE_CONFIG = ROOT / "configs" / "demo_cpu.yaml"
V2_FORCED = ("eval.split=test", "logging.wandb=false")
"""On top of the main job's config for every v2 suite: the test split for every row (the validation split, if
data.val_fraction makes one, still feeds GRPO's periodic validation), no wandb files. The shop is the config's
profiled one (data.synth_version 2-4; the committed v2_* tables were made with 2: data.synth_version=2 redoes
them)."""
SEED_KEYS = ("seed", "data.synth_seed", "eval.split")
"""Set by the v2 driver per workspace (--seeds) and V2_FORCED; an override of them is refused."""


def v2_base_config(path: str | Path, overrides: list[str] | tuple[str, ...]) -> Config:
    """The main job's config with the user's overrides and V2_FORCED (seeds come per workspace)."""
    for o in overrides:
        if o.split("=", 1)[0] in SEED_KEYS:
            raise ConfigError(f"{o!r}: the v2 suites set {', '.join(SEED_KEYS)} themselves (use --seeds)")
    cfg = load_config(path, [*overrides, *V2_FORCED])
    if cfg.data.synth_version < 2:
        raise ConfigError(f"data.synth_version={cfg.data.synth_version}: the v2 suites need the profiled shop (2-4)")
    return cfg


@dataclass(frozen=True)
class ContinuedSFT:
    """How long the "SFT continued" row trains: as many more SFT steps as fit in the Shop-R1 GRPO stage's wall time,
    at the SFT stage's own pace (both stage times include their start-up and saving)."""

    steps: int
    """floor(rl_seconds / seconds_per_step), at least 1."""
    seconds_per_step: float
    """sft_seconds / sft_steps."""
    sft_seconds: float
    sft_steps: int
    rl_seconds: float


def continued_sft_plan(sft_seconds: float, sft_steps: int, rl_seconds: float) -> ContinuedSFT:
    if sft_seconds <= 0 or sft_steps < 1 or rl_seconds <= 0:
        raise ValueError(f"continued SFT needs positive stage times and steps: SFT {sft_seconds} s over {sft_steps} "
                         f"steps, RL {rl_seconds} s")
    per_step = sft_seconds / sft_steps
    return ContinuedSFT(max(1, math.floor(rl_seconds * sft_steps / sft_seconds)), per_step, sft_seconds, sft_steps,
                        rl_seconds)


def _done(path: Path) -> bool:
    return path.exists()


def _mark(path: Path, info: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(info, indent=2))


class Workspace:
    """One data + model + SFT setup and the rows trained from it, under `root`."""

    def __init__(self, cfg: Config, root: Path) -> None:
        self.cfg, self.root = cfg, root
        self.times: dict[str, float] = json.loads((root / "stage_seconds.json").read_text()) \
            if (root / "stage_seconds.json").exists() else {}

    def _timed(self, name: str, start: float) -> None:
        self.times[name] = round(time.perf_counter() - start, 1)
        _mark(self.root / "stage_seconds.json", self.times)
        print(f"<== {name}: {self.times[name]:.0f}s", flush=True)

    def data(self) -> dict[str, str]:
        """The example files by name (`rl_val` only with data.val_fraction > 0)."""
        from shop_r1.data.build import build_datasets
        from shop_r1.pipeline import prepare_model, prepare_sessions

        out = self.root / "data"
        if not _done(out / "stats.json"):
            start = time.perf_counter()
            sessions = prepare_sessions(self.cfg, self.root)
            built = build_datasets(sessions, out, prepare_model(self.cfg, self.root), self.cfg.data, seed=self.cfg.seed)
            print(built.render(), flush=True)
            self._timed("data", start)
        files = {k: out / f"{k}.jsonl" for k in ("sft_train", "rl_train", "rl_test", "rl_val")}
        return {k: str(p) for k, p in files.items() if k != "rl_val" or p.exists()}

    def base_model(self) -> str:
        from shop_r1.pipeline import prepare_model

        return str(prepare_model(self.cfg, self.root))

    def model(self, row: Row, local: bool) -> str:
        """The model a row evaluates, trained first if it is not yet."""
        if row.model == "base":
            return self.base_model()
        if row.model == "sft":
            return self.sft(local)
        if row.model == "sft_continued":
            return self.sft_continued(local)
        return self.rl(row, local)

    def sft(self, local: bool) -> str:
        from shop_r1.sft import run_sft

        hf = self.root / "sft" / "hf"
        if not _done(hf / "done.json"):
            start = time.perf_counter()
            cfg = with_overrides(self.cfg, [f"run_dir={self.root / 'sft'}"])
            result = run_sft(cfg, self.base_model(), self.data()["sft_train"], self.root / "sft", local)
            _mark(hf / "done.json", {"steps": result.num_steps, "first_loss": result.first_loss,
                                     "last_loss": result.last_loss, "seconds": result.seconds})
            self._timed("sft", start)
        return str(hf)

    def _stage_seconds(self, stage: str, done: Path) -> float:
        """The driver's wall time of a finished stage (stage_seconds.json), else the time its marker records."""
        return float(self.times.get(stage) or json.loads(done.read_text())["seconds"])

    def sft_continued(self, local: bool) -> str:
        """The SFT model trained on for the Shop-R1 GRPO stage's wall time (`ContinuedSFT`): the same data, lr and
        warmup ratio (over the new steps), a fresh optimizer. RL has to beat more imitation, not only less."""
        from shop_r1.sft import run_sft

        out = self.root / "sft_continued"
        if not _done(out / "hf" / "done.json"):
            sft = self.sft(local)
            self.rl(SHOP_R1, local)  # its wall time is this row's budget
            sft_done, rl_done = self.root / "sft" / "hf" / "done.json", self.root / "rl" / "shop_r1" / "done.json"
            plan = continued_sft_plan(self._stage_seconds("sft", sft_done), json.loads(sft_done.read_text())["steps"],
                                      self._stage_seconds("rl/shop_r1", rl_done))
            if json.loads(rl_done.read_text()).get("resumed"):
                print(f"WARNING: {rl_done.parent} was resumed: its stage time counts the last attempt only",
                      flush=True)
            print(f"  SFT continued: {plan.steps} more steps ({plan.rl_seconds:.0f} s of GRPO at "
                  f"{plan.seconds_per_step:.2f} s per SFT step)", flush=True)
            start = time.perf_counter()
            cfg = with_overrides(self.cfg, [f"run_dir={out}", f"sft.max_steps={plan.steps}"])
            save_config(cfg, out / "config.yaml")
            result = run_sft(cfg, sft, self.data()["sft_train"], out, local)
            _mark(out / "hf" / "done.json", {"steps": result.num_steps, "first_loss": result.first_loss,
                                             "last_loss": result.last_loss, "seconds": result.seconds,
                                             "plan": asdict(plan)})
            self._timed("sft_continued", start)
        return str(out / "hf")

    def _val_prompts(self, cfg: Config, model: str) -> list | None:
        """As the pipeline's (shop_r1.pipeline._val_prompts): with rl.val_every > 0, rl.val_examples validation
        prompts drawn with the run's seed, for GRPO's periodic validation."""
        from shop_r1.pipeline import _rl_prompts

        if not cfg.rl.val_every:
            return None
        if "rl_val" not in self.data():
            raise ConfigError("rl.val_every > 0 needs a validation split: set data.val_fraction > 0")
        prompts = _rl_prompts(cfg, model, self.data()["rl_val"])
        return random.Random(cfg.seed).sample(prompts, min(cfg.rl.val_examples, len(prompts)))

    def rl(self, row: Row, local: bool) -> str:
        from shop_r1.pipeline import _pad_id, _rl_prompts
        from shop_r1.train import run_grpo

        out = self.root / "rl" / row.name
        if not _done(out / "done.json"):
            start = time.perf_counter()
            sft = self.sft(local)
            cfg = with_overrides(self.cfg, [*(row.rl_overrides or ()), f"run_dir={out}"])
            save_config(cfg, out / "config.yaml")
            resumed = (out / "grpo").exists()
            result = run_grpo(cfg, sft, _rl_prompts(cfg, sft, self.data()["rl_train"]), out / "grpo", local,
                              resume=True, pad_id=_pad_id(sft), val_prompts=self._val_prompts(cfg, sft))
            _mark(out / "done.json", {"steps": result.num_steps, "first_reward": result.first_reward,
                                      "last_reward": result.last_reward, "seconds": result.seconds,
                                      "resumed": resumed})
            self._timed(f"rl/{row.name}", start)
        return str(out / "grpo" / "hf")

    def evaluate(self, row: Row, model: str, local: bool) -> Path:
        from shop_r1.evaluate import evaluate

        out = self.root / "eval" / row.name
        if not _done(out / "metrics.json"):
            start = time.perf_counter()
            evaluate(self.cfg, model, self.data()["rl_test"], out, row.label, local)
            self._timed(f"eval/{row.name}", start)
        return out


def _run_rows(suite_name: str, rows: tuple[Row, ...], ws: Workspace, local: bool) -> None:
    # "SFT continued" needs the Shop-R1 GRPO stage's time: the other rows first.
    for row in sorted(rows, key=lambda r: r.model == "sft_continued"):
        print(f"==> {suite_name}: {row.label}", flush=True)
        ws.evaluate(row, ws.model(row, local), local)


def run_suite(name: str, root: Path, results_root: Path, overrides: list[str]) -> Path:
    from shop_r1.distributed.runtime import start_ray

    suite = SUITES[name]
    cfg = load_config(BASE_CONFIG, [*overrides, *suite.workspace_overrides])
    ws_root = root / suite.workspace if suite.workspace else root
    ws_root.mkdir(parents=True, exist_ok=True)
    cfg = with_overrides(cfg, [f"run_dir={ws_root}"])
    save_config(cfg, ws_root / "config.yaml")
    ws = Workspace(cfg, ws_root)
    ws.data()
    runtime = start_ray(cfg.ray)
    try:
        rows = tuple(Row(ALIASES.get(r.name, r.name), r.label, r.rl_overrides, r.model) for r in suite.rows)
        _run_rows(name, rows, ws, runtime.local_mode)
    finally:
        runtime.shutdown()
    return summarize(name, suite, ws_root, results_root)


def open_seed_workspace(base: Config, root: Path, k: int) -> Workspace:
    """Seed k's workspace with its config written, or checked against the one it was made with: a row reused from
    another suite (or another run of this one) must come from the same settings."""
    ws_root = seed_workspace(root, k)
    cfg = with_overrides(base, seed_overrides(root, k))
    saved = ws_root / "config.yaml"
    if saved.exists():
        changes = config_changes(load_config(saved), cfg)
        if changes:
            raise ConfigError(f"{ws_root} was made with another config ({'; '.join(changes)}); give another --root, "
                              "or remove the workspace to start it again")
    ws_root.mkdir(parents=True, exist_ok=True)
    save_config(cfg, saved)
    return Workspace(cfg, ws_root)


def _jsonl_rows(path: Path) -> list[dict]:
    """A metrics file's records (shop_r1/data/jsonl.py: a bad line raises naming FILE:LINE); none is an error."""
    from shop_r1.data.jsonl import read_jsonl_objects

    rows = [row for _, row in read_jsonl_objects(path)]
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


# The pipeline's stage names in its stage_seconds.json -> the workspace's (what `adopt_run` carries over).
PIPELINE_STAGES = {"SFT": "sft", "GRPO (Shop-R1)": "rl/shop_r1"}


def adopt_run(ws: Workspace, run: Path) -> list[str]:
    """Seed a v2 workspace with a finished main-job run (`shop-r1 pipeline`, run_dir RUN) made with the same config:
    its data, model, SFT model and Shop-R1 GRPO model become the workspace's stages, with their markers and stage
    times taken from the run's own records, so a seed's main job is not trained twice. Refused, naming the keys, if
    the run's config differs in anything that can change a result, and naming the file if a stage is missing. A stage
    the workspace already has is kept. Returns the stages adopted."""
    import shutil

    from shop_r1.config import load_config

    run = run.resolve()
    saved = run / "config.yaml"
    if not saved.exists():
        raise ConfigError(f"--adopt {run}: no config.yaml (not a pipeline run folder)")
    changes = config_changes(load_config(saved), ws.cfg)
    if changes:
        raise ConfigError(f"--adopt {run}: made with another config than {ws.root} ({'; '.join(changes)})")
    need = [run / "data" / "stats.json", run / "model" / "shop_lm" / "shop_r1_model.json",
            run / "sft" / "hf" / "config.json", run / "grpo" / "hf" / "config.json", run / "stage_seconds.json",
            run / "metrics_sft.jsonl", run / "metrics_grpo.jsonl"]
    missing = [str(p) for p in need if not p.exists()]
    if missing:
        raise ConfigError(f"--adopt {run}: the run is not finished, missing {', '.join(missing)}")
    seconds = json.loads((run / "stage_seconds.json").read_text())
    absent = [k for k in PIPELINE_STAGES if k not in seconds]
    if absent:
        raise ConfigError(f"--adopt {run}: stage_seconds.json has no {', '.join(absent)}")
    adopted = []

    def copy(src: Path, dst: Path) -> None:
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)

    if not _done(ws.root / "data" / "stats.json"):
        for f in sorted((run / "data").iterdir()):
            if f.name != "stats.json":
                copy(f, ws.root / "data" / f.name)
        copy(run / "data" / "stats.json", ws.root / "data" / "stats.json")  # the marker last
        adopted.append("data")
    if not (ws.root / "model" / "shop_lm" / "shop_r1_model.json").exists():
        copy(run / "model" / "shop_lm", ws.root / "model" / "shop_lm")
        adopted.append("model")
    if not _done(ws.root / "sft" / "hf" / "done.json"):
        sft = _jsonl_rows(run / "metrics_sft.jsonl")
        copy(run / "sft" / "hf", ws.root / "sft" / "hf")
        _mark(ws.root / "sft" / "hf" / "done.json",
              {"steps": int(sft[-1]["step"]), "first_loss": sft[0]["sft/loss"], "last_loss": sft[-1]["sft/loss"],
               "seconds": seconds["SFT"], "adopted_from": str(run)})
        ws.times["sft"] = seconds["SFT"]
        adopted.append("sft")
    rl = ws.root / "rl" / SHOP_R1.name
    if not _done(rl / "done.json"):
        grpo = _jsonl_rows(run / "metrics_grpo.jsonl")
        copy(run / "grpo" / "hf", rl / "grpo" / "hf")
        for name in ("metrics_grpo.jsonl", "rollouts.jsonl"):
            if (run / name).exists():
                copy(run / name, rl / name)
        _mark(rl / "done.json", {"steps": int(grpo[-1]["step"]), "first_reward": grpo[0].get("reward/total"),
                                 "last_reward": grpo[-1].get("reward/total"), "seconds": seconds["GRPO (Shop-R1)"],
                                 "resumed": False, "adopted_from": str(run)})
        ws.times["rl/shop_r1"] = seconds["GRPO (Shop-R1)"]
        adopted.append("rl/shop_r1")
    _mark(ws.root / "stage_seconds.json", ws.times)
    return adopted


def parse_adopt(values: list[str], seeds: tuple[int, ...]) -> dict[int, Path]:
    """`--adopt K=RUN_DIR ...` -> {K: RUN_DIR}; K must be one of the suite's seeds."""
    out: dict[int, Path] = {}
    for v in values:
        k, sep, path = v.partition("=")
        if not sep or not k.strip().lstrip("-").isdigit() or not path:
            raise ConfigError(f"--adopt {v!r}: expected SEED=RUN_DIR, e.g. 31=runs/default")
        if int(k) not in seeds:
            raise ConfigError(f"--adopt {v!r}: seed {int(k)} is not among --seeds {list(seeds)}")
        out[int(k)] = Path(path)
    return out


def run_v2_suite(name: str, root: Path, results_root: Path, overrides: list[str], seeds: tuple[int, ...],
                 config: Path = V2_BASE_CONFIG, adopt: dict[int, Path] | None = None,
                 carry: Path | None = None) -> Path:
    from shop_r1.distributed.runtime import start_ray

    base = v2_base_config(config, overrides)  # read once: editing the file mid-run changes nothing here
    root = root.resolve()
    suite = v2_suite(name, base)
    for note in suite.notes:
        print(f"  note: {note}", flush=True)
    if carry is not None:
        check_carry(carry, base, root)  # before any training: a table that cannot be carried fails now, not after
        kept = sorted(set(carried_seeds(carry, name, suite.rows, exclude=seeds)))
        print(f"  carried from {carry}: seed(s) {', '.join(map(str, kept)) or 'none'}", flush=True)
    workspaces = [open_seed_workspace(base, root, k) for k in seeds]
    for k, ws in zip(seeds, workspaces):
        if adopt and k in adopt:
            print(f"  seed {k}: adopted from {adopt[k]}: {', '.join(adopt_run(ws, adopt[k])) or 'nothing new'}",
                  flush=True)
        ws.data()
    runtime = start_ray(base.ray)
    try:
        for k, ws in zip(seeds, workspaces):
            _run_rows(f"{name} seed {k}", suite.rows, ws, runtime.local_mode)
    finally:
        runtime.shutdown()
    return summarize_seeds(name, suite, {k: ws.root for k, ws in zip(seeds, workspaces)}, results_root, carry)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", choices=[*sorted(SUITES), *V2_SUITES])
    p.add_argument("--root", default=str(ROOT / "runs" / "experiments"), help="workspace (resumable)")
    p.add_argument("--results", default=str(ROOT / "experiments" / "results"))
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help=f"v2 suites: one workspace per seed k (seed=k data.synth_seed=k); default {list(V2_SEEDS)}")
    p.add_argument("--config", default=str(V2_BASE_CONFIG), help="v2 suites: the base config (the main job's)")
    p.add_argument("--adopt", nargs="+", default=[], metavar="SEED=RUN_DIR",
                   help="v2 suites: take seed SEED's data, model, SFT and Shop-R1 stages from a finished main-job "
                        "run of the same config (`bash scripts/run_main.sh seed=K data.synth_seed=K`)")
    p.add_argument("--carry", default=None, metavar="RESULTS_DIR",
                   help="v2 suites: the seeds of an earlier summary of this suite (RESULTS_DIR/results.json and "
                        "predictions/) join the table, re-read from their committed predictions; it must have been "
                        "made with the same config. A seed also given by --seeds is run here instead")
    p.add_argument("overrides", nargs="*", help="dotted config overrides on top of the suite's base config")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_intermixed_args(argv)
    if args.suite in V2_SUITES:
        seeds = tuple(args.seeds if args.seeds is not None else V2_SEEDS)
        out = run_v2_suite(args.suite, Path(args.root), Path(args.results), args.overrides, seeds, Path(args.config),
                           parse_adopt(args.adopt, seeds), Path(args.carry) if args.carry else None)
    else:
        if args.seeds is not None or args.config != str(V2_BASE_CONFIG) or args.adopt or args.carry:
            p.error("--seeds, --config, --adopt and --carry are for the v2 suites; the others run "
                    "experiments/configs/base.yaml")
        out = run_suite(args.suite, Path(args.root), Path(args.results), args.overrides)
    print(f"results: {out}", flush=True)
    print((out / "table.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
