"""One-step-off async GRPO against the synchronous loop: the step time of the real GRPO driver (`run_grpo`, Ray,
vLLM engine, DeepSpeed learner) with `rl.async_level=1` and with `rl.async_level=0`, on the same model, prompts,
group size, new tokens, steps and seed.

    async_level=0   each step: generate + score, then update, then weight sync
    async_level=1   step t+1's rollout is generated + scored (by the weights of step t-1) while step t's update
                    runs; the push of step t's weights waits for it (shop_r1/distributed/rollouts.py)

Each side is a fresh `run_grpo` under its own Ray cluster, in a process of its own (`common.run_child`). The pair
runs `--repeats` times alternately (sync, async, sync, async, ...) so that drifting load on the machine hits both
sides; the headline is the median over repeats of (sync median step time) / (async median step time).

Timed steps: those after the first `WARMUP_STEPS` (start-up, the first overlap) and before the last: the last
step of the one-step-off loop has no next rollout to generate beside its update (a drain, not a steady-state
step, and faster for it), so it is left out on both sides. Per side and repeat: median and spread of
`timing/step`, samples/s, the median of `timing/rollout` (async: what the step waited for rollouts), `timing/update`,
`timing/weight_sync` and (async) `timing/rollout_overlapped` (the generate + score time that ran beside the update),
and the largest `rollout/policy_lag_max` (0 sync, 1 async).

Why the gain is small on a 2-core CPU machine: the engine and the learner each reserve every core (`--threads`, as
the demo configs do, since the synchronous loop never runs them at once); overlapped, they compete for the same two
cores, so the overlapped rollout is slower than a rollout alone and the update beside it is too. What async saves
here is mostly the idle time of the hand-offs (the driver, the reward workers, the sync). The design targets
clusters where rollout engines and learner ranks run on different GPUs: there the overlapped rollout is free, and
the step time tends to max(rollout, update) instead of their sum.

`--pin ENGINE_CORES:LEARNER_CORES` (e.g. `0:1`): both sides at the same placement, the engine pinned to the first
list and the learner to the second (rollout.cpu_cores, learner.cpu_cores: disjoint cores, as many threads each,
passive OpenMP waits), so that overlapped they do not compete for cores; sync then runs each stage on its own cores.

Run: python benchmarks/bench_async.py [--model tiny|smollm2|DIR] [--steps 8] [--prompts 2] [--n 4]
                                      [--max-new-tokens 40] [--prompt-tokens 1024] [--repeats 2] [--pin 0:1]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, fixed_length_prompts, model_dir, run_child, spread  # noqa: E402

WARMUP_STEPS = 2
STAGES = ("rollout", "reward", "advantages", "update", "weight_sync", "rollout_overlapped")
"""The `timing/*` stages reported per side (shop_r1/train.py: step_metrics), where the side logs them."""
SIDES = {0: "sync", 1: "async"}
SIDE_TIMEOUT_S = 3600


def all_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def timed_rows(rows: list[dict], warmup: int = WARMUP_STEPS) -> list[dict]:
    """The steps of a run that are timed: after the first `warmup` and before the last (see the module docstring).
    A step logged twice (a run that resumed after an actor died) counts once, as its last occurrence."""
    by_step = {int(r["step"]): r for r in rows}
    steps = sorted(by_step)
    return [by_step[s] for s in steps[warmup:-1]]


def summarize_side(async_level: int, rows: list[dict], batch: int, warmup: int = WARMUP_STEPS) -> dict:
    """One run's figures from its per-step metrics rows (metrics_grpo.jsonl): medians and spreads over the timed
    steps of step time and samples/s (`batch` = P x G samples per step), the median of each stage present, and the
    largest policy lag."""
    timed = timed_rows(rows, warmup)
    if not timed:
        raise ValueError(f"{SIDES[async_level]}: no timed step in {len(rows)} logged; run at least {warmup + 2} steps "
                         f"(the first {warmup} warm up, the last drains)")
    step_s = [r["timing/step"] for r in timed]
    spreads = {"step_s": spread(step_s), "samples_per_s": spread([batch / t for t in step_s])}
    return {"side": SIDES[async_level], "async_level": async_level, "timed_steps": [int(r["step"]) for r in timed],
            "step_s": spreads["step_s"]["median"], "samples_per_s": spreads["samples_per_s"]["median"],
            "spread": spreads,
            "stage_s": {k: spread([r[f"timing/{k}"] for r in timed])["median"] for k in STAGES
                        if all(f"timing/{k}" in r for r in timed)},
            "policy_lag_max": max(r["rollout/policy_lag_max"] for r in timed),
            "warmup_step_s": [r["timing/step"] for r in sorted(rows, key=lambda r: r["step"])[:warmup]]}


def compare(pairs: list[tuple[dict, dict]]) -> dict:
    """The repeats, each a (sync, async) pair of `summarize_side` results: per repeat sync step time over async
    step time (above 1: async is faster), and their median; per side the median over repeats of its median step
    time and samples/s."""
    if not pairs:
        raise ValueError("compare: no repeat")
    ratios = [s["step_s"] / a["step_s"] for s, a in pairs]
    sides = {name: [pair[i] for pair in pairs] for i, name in enumerate(("sync", "async"))}
    return {"ratio_sync_over_async": spread(ratios)["median"], "ratios": ratios,
            **{f"{name}_step_s": spread([r["step_s"] for r in runs])["median"] for name, runs in sides.items()},
            **{f"{name}_samples_per_s": spread([r["samples_per_s"] for r in runs])["median"]
               for name, runs in sides.items()}}


# ------------------------------------------------------------------------------------------------ one side


def _overrides(args: argparse.Namespace, run: Path, context: int) -> list[str]:
    t = args.threads
    return [
        f"run_dir={run}", f"seed={args.seed}", f"rl.steps={args.steps}", f"rl.async_level={args.side}",
        f"rollout.group_size={args.n}", f"rl.global_batch_size={args.prompts * args.n}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"model.max_context_tokens={context}",
        # Learner and engine each reserve every core (they take turns when synchronous, compete when overlapped);
        # the cluster advertises room for both plus the reward workers.
        f"learner.num_cpus_per_rank={t}", f"rollout.num_cpus_per_engine={t}", f"ray.num_cpus={2 * t + 2}",
        "logging.wandb=false", "logging.console_every=0", f"rl.checkpoint_every={10**6}",
        *_pinning(args.pin)]


def _pinning(pin: str) -> list[str]:
    """--pin ENGINE:LEARNER -> the overrides that pin the engine and the learner to those cores, as many Ray CPUs."""
    if not pin:
        return []
    from shop_r1.config import parse_cpu_cores

    engine, sep, learner = pin.partition(":")
    if not sep:
        raise SystemExit(f"bench_async: --pin {pin!r}: expected ENGINE_CORES:LEARNER_CORES, e.g. 0:1")
    n_engine = len(parse_cpu_cores(engine, "--pin (engine)"))
    n_learner = len(parse_cpu_cores(learner, "--pin (learner)"))
    return [f"rollout.cpu_cores={engine}", f"learner.cpu_cores={learner}",
            f"rollout.num_cpus_per_engine={n_engine}", f"learner.num_cpus_per_rank={n_learner}"]


def side(args: argparse.Namespace) -> dict:
    """One fresh GRPO run under Ray at `rl.async_level=args.side`; its summary."""
    from shop_r1.config import load_config
    from shop_r1.distributed.runtime import start_ray
    from shop_r1.train import run_grpo

    data = pickle.loads(Path(args.prompts_file).read_bytes())  # written by this script's parent process
    prompts, pad_id = data["prompts"], data["pad_id"]
    run = Path(args.tmp)
    cfg = load_config(None, _overrides(args, run, max(len(p.token_ids) for p in prompts) + args.max_new_tokens))
    runtime = start_ray(cfg.ray)
    try:
        start = time.perf_counter()
        run_grpo(cfg, args.model, prompts, run / "grpo", local=False, pad_id=pad_id)
        wall = time.perf_counter() - start
    finally:
        runtime.shutdown()
    rows = [json.loads(x) for x in (run / "metrics_grpo.jsonl").read_text().splitlines()]
    out = summarize_side(args.side, rows, args.prompts * args.n)
    out["setup_s"] = wall - sum({r["step"]: r["timing/step"] for r in rows}.values())
    out["threads"] = {k: v for k, v in rows[0].items() if k.startswith("threads/")}
    out["steps"] = [{k: v for k, v in r.items() if k == "step" or k.startswith(("timing/", "rollout/policy_lag"))}
                    for r in rows]
    return out


# ------------------------------------------------------------------------------------------------ the pair


def _write_prompts(model: str, args: argparse.Namespace, path: Path) -> int:
    """The prompts both sides take (P x steps of them, each cut to --prompt-tokens), pickled for the children;
    returns the prompt tokens of one prompt as measured."""
    from transformers import AutoTokenizer

    from shop_r1.types import Prompt

    tok = AutoTokenizer.from_pretrained(model)
    texts = fixed_length_prompts(model, args.prompts * args.steps, args.prompt_tokens, seed=args.seed)
    prompts = [Prompt(example_id=str(i), token_ids=tuple(tok(p.text, add_special_tokens=False)["input_ids"]),
                      target=p.target) for i, p in enumerate(texts)]
    path.write_bytes(pickle.dumps({"prompts": prompts, "pad_id": tok.pad_token_id or 0}))
    return max(len(p.token_ids) for p in prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny | smollm2 | a model folder")
    parser.add_argument("--steps", type=int, default=8, help=f"GRPO steps per run (timed: all but the first "
                                                             f"{WARMUP_STEPS} and the last)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (group size G)")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="every prompt cut to this many tokens")
    parser.add_argument("--repeats", type=int, default=2, help="sync/async pairs, run alternately")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=all_cores(), help="Ray CPUs reserved by the engine and by "
                                                                         "the learner each (default: all cores)")
    parser.add_argument("--pin", default="", help="ENGINE_CORES:LEARNER_CORES, e.g. 0:1 (both sides)")
    parser.add_argument("--side", type=int, choices=tuple(SIDES), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prompts-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", default="", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    if args.side is not None:
        emit(side(args), args.json_out)
        return
    if args.steps < WARMUP_STEPS + 2 or args.repeats < 1:
        raise SystemExit(f"bench_async: --steps must be >= {WARMUP_STEPS + 2} (warm-up, then at least one timed "
                         "step, then the last) and --repeats >= 1")
    tmp = Path(tempfile.mkdtemp(prefix="bench_async_"))
    try:
        model = model_dir(args.model, tmp)
        prompt_tokens = _write_prompts(model, args, tmp / "prompts.pkl")
        child = [__file__, "--model", model, "--prompts-file", str(tmp / "prompts.pkl"), "--steps", str(args.steps),
                 "--prompts", str(args.prompts), "--n", str(args.n), "--max-new-tokens", str(args.max_new_tokens),
                 "--seed", str(args.seed), "--threads", str(args.threads), "--pin", args.pin]
        env = {"OMP_NUM_THREADS": str(args.threads)}
        pairs = []
        for repeat in range(args.repeats):
            pair = []
            for level, name in SIDES.items():
                print(f"[bench_async] repeat {repeat + 1}/{args.repeats}: {name}", file=sys.stderr, flush=True)
                run = tmp / f"{name}_{repeat}"
                pair.append(run_child([*child, "--side", str(level), "--tmp", str(run)], timeout_s=SIDE_TIMEOUT_S,
                                      env=env))
                shutil.rmtree(run, ignore_errors=True)  # the run's checkpoint: GBs with SmolLM2
            pairs.append((pair[0], pair[1]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"model": args.model, "steps": args.steps, "warmup_steps": WARMUP_STEPS,
              "timed_steps": args.steps - WARMUP_STEPS - 1, "prompts_per_step": args.prompts, "n": args.n,
              "max_new_tokens": args.max_new_tokens, "prompt_tokens": prompt_tokens, "seed": args.seed,
              "threads": args.threads, "pin": args.pin or None, "repeats": args.repeats, **compare(pairs),
              "runs": [{"sync": s, "async": a} for s, a in pairs]}
    emit(result, args.json_out)


if __name__ == "__main__":
    main()
