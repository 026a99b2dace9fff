"""The benchmark suite: every benchmark, one after another, on whatever this machine has (CPU here, CUDA where
present), into `benchmarks/results/<machine>/`: `results.json`, `machine.json`, a Markdown summary (`README.md`)
and plots. Every figure is a ratio of two things measured side by side in the same run.

Run: bash scripts/run_benchmarks.sh            (sets up .venv, then runs this)
     python benchmarks/run_suite.py [--only rouge,reward_pool,...] [--quick] [--out DIR]
`--quick` shrinks every benchmark (tiny model only) for a smoke test; the committed results are a full run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import machine, run_child  # noqa: E402

# name -> (script, full-run args, quick args). Sizes for full runs are chosen so the whole suite finishes in about an
# hour on a quiet 2-core CPU machine (most of it the SmolLM2 race); on GPUs pass bigger sizes to the scripts directly.
SUITE: dict[str, tuple[str, list[str], list[str]]] = {
    "rouge": ("bench_rouge.py", ["--pairs", "20000"], ["--pairs", "2000"]),
    "reward_pool": ("bench_reward_pool.py", ["--responses", "4000", "--actors", "1,2,4"],
                    ["--responses", "600", "--actors", "1,2"]),
    "rollout": ("bench_rollout.py", ["--prompts", "16", "--n", "4", "--max-new-tokens", "64"],
                ["--prompts", "4", "--n", "2", "--max-new-tokens", "16"]),
    "learner": ("bench_learner.py", ["--batch", "8", "--prompt-tokens", "512", "--completion-tokens", "64"],
                ["--batch", "4", "--prompt-tokens", "128", "--completion-tokens", "16", "--steps", "2"]),
    "causal_mask": ("bench_causal_mask.py", ["--repeats", "5"], ["--repeats", "1", "--rows", "6"]),
    "weight_sync": ("bench_weight_sync.py", ["--steps", "4"], ["--steps", "2"]),
    # The same on SmolLM2-135M (540 MB of fp32 weights): the sync's cost against moving the bytes.
    "weight_sync_smollm2": ("bench_weight_sync.py", ["--model", "smollm2", "--steps", "3"], []),
    # One-step-off async against the synchronous loop: sync, async, sync, async; 5 timed steps of 8 per run.
    "async": ("bench_async.py", ["--model", "tiny", "--steps", "8", "--prompts", "2", "--n", "4", "--max-new-tokens",
                                 "40", "--prompt-tokens", "1024", "--repeats", "2"],
              ["--model", "tiny", "--steps", "4", "--prompts", "1", "--n", "2", "--max-new-tokens", "8",
               "--prompt-tokens", "256", "--repeats", "1"]),
    # The fair TRL races (bench_trl.py): 1 warm-up + 5 timed steps, every prompt cut to 1024 tokens.
    "trl_smollm2": ("bench_trl.py", ["--model", "smollm2", "--prompts", "2", "--n", "4", "--steps", "6",
                                     "--max-new-tokens", "48", "--prompt-tokens", "1024"], []),
    "trl_tiny": ("bench_trl.py", ["--model", "tiny", "--prompts", "2", "--n", "4", "--steps", "6",
                                  "--max-new-tokens", "48", "--prompt-tokens", "1024"],
                 ["--model", "tiny", "--prompts", "1", "--n", "2", "--steps", "2", "--max-new-tokens", "8",
                  "--prompt-tokens", "256"]),
    "trl_scaling": ("bench_trl.py", ["--scaling", "--model", "tiny", "--prompts", "1", "--n", "4",
                                     "--max-new-tokens", "48", "--scaling-steps", "3"],
                    ["--scaling", "--model", "tiny", "--prompts", "1", "--n", "2", "--max-new-tokens", "8",
                     "--scaling-steps", "2", "--scaling-lengths", "256,512", "--scaling-groups", "2,4",
                     "--scaling-prompt-tokens", "256"]),
}
QUICK_SKIPS = {"trl_smollm2", "weight_sync_smollm2"}
TIMEOUT_S = {"trl_smollm2": 4 * 3600, "trl_scaling": 2 * 3600}
"""Per benchmark, where the default hour is too short (SmolLM2 steps take minutes on 2 cores)."""
TRL_RACES = {"trl_smollm2": "SmolLM2-135M", "trl_tiny": "tiny Qwen2"}


def summary_rows(results: dict) -> list[tuple[str, str, str, str]]:
    """(benchmark, ours, reference, ratio) lines of the summary table, for whatever was run."""
    rows = []
    if r := results.get("rouge"):
        rows.append(("ROUGE-L (reward)", f"{r['shop_r1_pairs_per_s']:,.0f} pairs/s",
                     f"rouge-score {r['rouge_score_pairs_per_s']:,.0f} pairs/s", f"{r['speedup']:.2f}x"))
    if r := results.get("reward_pool"):
        last = r["pool"][-1]
        rows.append(("Reward pool, 1 actor", f"{r['pool'][0]['responses_per_s']:,.0f} responses/s",
                     f"in-driver {r['direct_responses_per_s']:,.0f} responses/s", f"{r['pool1_over_direct']:.2f}x"))
        rows.append((f"Reward pool, {last['actors']} actors", f"{last['responses_per_s']:,.0f} responses/s",
                     f"1 actor {r['pool'][0]['responses_per_s']:,.0f} responses/s",
                     f"{last['scaling_vs_1_actor']:.2f}x"))
    if r := results.get("rollout"):
        rows.append(("Rollout (engine group)", f"{r['group_tokens_per_s']:,.0f} tokens/s",
                     f"direct vLLM {r['direct_tokens_per_s']:,.0f} tokens/s", f"{r['ratio_group_over_direct']:.2f}x"))
    if r := results.get("learner"):
        rows.append(("Learner (group, GRPO step)", f"{r['group_tokens_per_s']:,.0f} tokens/s",
                     f"bare DeepSpeed, full-vocab logits {r['bare_tokens_per_s']:,.0f} tokens/s",
                     f"{r['ratio_group_over_bare']:.2f}x"))
    if r := results.get("causal_mask"):
        rows.append((f"SFT micro-batches, right-padded rows ({r['shape']})",
                     f"causal mask {r['causal_s']['median']:.2f} s",
                     f"padding mask {r['padding_mask_s']['median']:.2f} s",
                     f"{r['padding_over_causal']['median']:.2f}x"))
    if r := results.get("weight_sync"):
        rows.append(("Weight sync", f"{r['weight_sync_s'] * 1e3:.1f} ms ({r['weight_sync_gb_per_s']:.2f} GB/s)",
                     f"raw broadcast {r['raw_broadcast_s'] * 1e3:.1f} ms ({r['raw_broadcast_gb_per_s']:.2f} GB/s)",
                     f"{r['sync_over_raw']:.1f}x the time"))
        rows.append(("GRPO step outside the 4 stages", (f"{100 * r['share_outside_stages']:.1f}% of "
                                                         f"{r['step_s']:.2f} s"), "-", "-"))
    if r := results.get("weight_sync_smollm2"):
        rows.append(("Weight sync, SmolLM2-135M", f"{r['weight_sync_s'] * 1e3:.0f} ms "
                     f"({r['weight_sync_gb_per_s']:.2f} GB/s)", f"raw broadcast {r['raw_broadcast_s'] * 1e3:.0f} ms "
                     f"({r['raw_broadcast_gb_per_s']:.2f} GB/s)", f"{r['sync_over_raw']:.2f}x the time"))
    if r := results.get("async"):
        rows.append(("GRPO step, one-step-off async vs sync", f"{fmt(r['async_step_s'])} s/step",
                     f"sync {fmt(r['sync_step_s'])} s/step", f"{r['ratio_sync_over_async']:.2f}x"))
    for key, label in TRL_RACES.items():
        if r := results.get(key):
            rows.append((f"GRPO vs TRL, {label}: samples/s", f"{r['shop_r1']['samples_per_s']:.3f}",
                         f"TRL {r['trl']['samples_per_s']:.3f}", f"{r['samples_per_s_ratio']:.2f}x"))
            rows.append((f"GRPO vs TRL, {label}: gen. tokens/s", f"{r['shop_r1']['generated_tokens_per_s']:.1f}",
                         f"TRL {r['trl']['generated_tokens_per_s']:.1f}", f"{r['generated_tokens_per_s_ratio']:.2f}x"))
    return rows


def fmt(x: float) -> str:
    """A measured figure with as many digits as it deserves: 201, 20.1, 2.01, 0.201."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3f}"


def setting_text(value: object) -> str:
    """A setting as the table shows it: a per-actor dict as `learner 2, engine 2`, booleans as on/off."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {setting_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return " / ".join(setting_text(v) for v in value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1:
        return f"{value:,.0f}"
    return str(value)


def settings_table(rows: list[dict]) -> list[str]:
    """The side-by-side settings of a TRL race, as Markdown."""
    lines = ["| setting | TRL | shop-r1 | |", "|---|---|---|---|"]
    for row in rows:
        verdict = ("not reported" if row["same"] is None else "same" if row["same"]
                   else "by design" if row["kind"] == "by design" else "**differs**")
        lines.append(f"| {row['setting']} | {setting_text(row['trl'])} | {setting_text(row['shop_r1'])} | {verdict} |")
    return lines


def rss_text(peak: float | dict | None) -> str:
    if peak is None:
        return "-"
    if isinstance(peak, dict):
        return ", ".join(f"{k} {v:.1f}" for k, v in peak.items())
    return f"{peak:.1f}"


def median_range(spread: dict) -> str:
    return f"{fmt(spread['median'])} [{fmt(spread['min'])}-{fmt(spread['max'])}]"


def race_lines(r: dict) -> list[str]:
    """One TRL race: how it was run, the settings side by side, then per side the timed steps' median [min-max]
    of step time, samples/s and generated tokens/s, the median time per stage, the warm-up step and start-up."""
    prompts = (f"every prompt cut to {r['prompt_tokens']} tokens" if r.get("prompt_tokens")
               else f"prompts up to {r['max_prompt_tokens']} tokens")
    how = (f"{r['prompts_per_step']} prompts x n={r['n']} per step, {r['max_new_tokens']} new tokens, {prompts}, "
           f"{r['threads']} threads per side; {r['timed_steps']} timed steps after {r['warmup_steps']} warm-up. "
           "Settings as each side reported them from its own processes (shop-r1: inside its actors, while they work):")
    header = ("| side | s/step | samples/s | gen. tokens/s | time per stage (median s) | warm-up step s | start-up s "
              "| peak RSS GiB |")
    lines = [how, "", *settings_table(r["settings"]), "", header, "|---|---:|---:|---:|---|---:|---:|---|"]
    for name, side in (("TRL", r["trl"]), ("shop-r1", r["shop_r1"])):
        sp = side["spread"]
        stages = ", ".join(f"{k} {fmt(v)}" for k, v in side["stage_s"].items())
        lines.append(f"| {name} | {median_range(sp['step_s'])} | {median_range(sp['samples_per_s'])} | "
                     f"{median_range(sp['generated_tokens_per_s'])} | {stages} | {fmt(side['warmup_step_s'])} | "
                     f"{fmt(side['setup_s'])} | {rss_text(side.get('peak_rss_gib'))} |")
    note = (f"Median [min-max] over the timed steps (quartiles in `results.json`); shop-r1 takes a step "
            f"{r['speedup']:.2f}x as fast as TRL. Start-up: TRL's trainer construction; shop-r1's time outside the "
            "steps (actors, vLLM and DeepSpeed start-up, the final checkpoint and shutdown; Ray's start not included).")
    return [*lines, "", note]


def scaling_lines(r: dict) -> list[str]:
    """The scaling table: both sides on the same inputs, as prompt length grows at fixed n, and as n grows."""
    how = (f"Model `{r['model']}`, {r['prompts_per_step']} prompt(s) per step, {r['max_new_tokens']} new tokens, "
           f"{r['threads']} threads per side. {r['note']}. Prompts: {r['prompts']}.")
    header = ("| sweep | prompt tokens | n | TRL s/step | shop-r1 s/step | speedup | TRL gen. tokens/s | "
              "shop-r1 gen. tokens/s |")
    lines = [how, "", header, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for sweep, key in ((f"prompt length (n={r['fixed_n']})", "by_prompt_tokens"),
                       (f"group size ({r['fixed_prompt_tokens']} tokens)", "by_n")):
        for row in r[key]:
            tokens = f"{row['prompt_tokens']:,}"
            measured = (row["trl_prompt_tokens_per_step"], row["shop_r1_prompt_tokens_per_step"])
            if measured != (row["prompt_tokens"] * r["prompts_per_step"],) * 2:  # a cut that missed its length
                tokens += f" (per step: TRL {measured[0]:,.0f}, shop-r1 {measured[1]:,.0f})"
            lines.append(f"| {sweep} | {tokens} | {row['n']} | {fmt(row['trl_step_s'])} | "
                         f"{fmt(row['shop_r1_step_s'])} | {row['speedup']:.2f}x | "
                         f"{fmt(row['trl_generated_tokens_per_s'])} | {fmt(row['shop_r1_generated_tokens_per_s'])} |")
    return lines


def async_lines(r: dict) -> list[str]:
    """One-step-off async against sync: how it was run, then per repeat and side the timed steps' median [min-max]
    of step time and samples/s, the median time per stage and the largest policy lag."""
    how = (f"Model `{r['model']}`, {r['prompts_per_step']} prompts x G={r['n']} per step, {r['max_new_tokens']} new "
           f"tokens, prompts of {r['prompt_tokens']:,} tokens, {r['threads']} threads for the engine and for the "
           f"learner each; {r['timed_steps']} timed steps per run (after {r['warmup_steps']} warm-up, the last left "
           f"out), {r['repeats']} repeat(s) run alternately. Step time sync / async: "
           + ", ".join(f"{x:.2f}x" for x in r["ratios"]) + f" (median {r['ratio_sync_over_async']:.2f}x).")
    lines = [how, "", "| repeat | side | s/step | samples/s | time per stage (median s) | policy lag max |",
             "|---:|---|---:|---:|---|---:|"]
    for i, run in enumerate(r["runs"], 1):
        for name in ("sync", "async"):
            side = run[name]
            stages = ", ".join(f"{k} {fmt(v)}" for k, v in side["stage_s"].items())
            lines.append(f"| {i} | {name} | {median_range(side['spread']['step_s'])} | "
                         f"{median_range(side['spread']['samples_per_s'])} | {stages} | {side['policy_lag_max']:.0f} |")
    note = ("async: `rollout` is what the step waited for rollouts, `rollout_overlapped` the generate + score time "
            "that ran beside the update. On a few shared CPU cores the engine and the learner compete for the same "
            "cores when overlapped, so the gain is small; the design targets rollout and training on separate GPUs.")
    return [*lines, "", note]


def write_summary(out: Path, info: dict, results: dict, seconds: dict[str, float], plots: list[str]) -> None:
    lines = [f"# Benchmarks on `{info['name']}`", "",
             f"{info['cpu_model']}, {info['cpu_cores']} cores ({info['cpu_isa']}), {info['ram_gib']} GiB RAM"
             + (f", GPUs: {', '.join(info['gpus'])}" if info.get("gpus") else ", no GPU") + ".",
             (f"torch {info['torch']}, vLLM {info['vllm']}, DeepSpeed {info['deepspeed']}, Ray {info['ray']}, "
              f"transformers {info['transformers']}, TRL {info['trl']}."), "",
             ("Each ratio compares two things measured side by side in the same run (`results.json` has every number;"
              " `run_suite.py` the sizes). GRPO vs TRL figures are medians over the timed steps."), "",
             "| benchmark | shop-r1 | reference | ratio |", "|---|---:|---:|---:|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in summary_rows(results)]
    for key, label in TRL_RACES.items():
        if r := results.get(key):
            lines += ["", f"### GRPO vs TRL, {label} (`{key}`)", "", *race_lines(r)]
    if r := results.get("async"):
        lines += ["", "### GRPO step, one-step-off async vs sync (`async`)", "", *async_lines(r)]
    if r := results.get("trl_scaling"):
        lines += ["", "### GRPO vs TRL: scaling (`trl_scaling`)", "", *scaling_lines(r)]
    lines += ["", "Wall time per benchmark: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()) + ".", ""]
    lines += [f"![{p}]({p})" for p in plots]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def write_plots(out: Path, results: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    ratios = {a: float(d.rstrip("x").split("x")[0]) for a, _, _, d in summary_rows(results) if d.endswith("x")}
    if ratios:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(ratios) + 1.2))
        ax.barh(list(ratios), list(ratios.values()), color="tab:blue")
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xlabel("shop-r1 / reference (higher is better)")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(out / "ratios.png", dpi=110)
        plt.close(fig)
        made.append("ratios.png")
    splits = {}
    if r := results.get("weight_sync"):
        splits["shop-r1 GRPO step (tiny)"] = r["share_by_stage"]
    for key in TRL_RACES:
        if r := results.get(key):
            splits[f"TRL ({key[4:]})"] = r["trl"]["share"]
            splits[f"shop-r1 ({key[4:]})"] = r["shop_r1"]["share"]
    if splits:
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(splits) + 1.5))
        stages = list(dict.fromkeys(k for s in splits.values() for k in s))
        left = [0.0] * len(splits)
        for stage in stages:
            vals = [max(0.0, s.get(stage, 0.0)) for s in splits.values()]
            ax.barh(list(splits), vals, left=left, label=stage)
            left = [a + b for a, b in zip(left, vals)]
        ax.set_xlabel("share of step time")
        ax.invert_yaxis()
        ax.legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
        fig.tight_layout()
        fig.savefig(out / "step_split.png", dpi=110)
        plt.close(fig)
        made.append("step_split.png")
    if r := results.get("trl_scaling"):
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        for ax, key, x, label in ((axes[0], "by_prompt_tokens", "prompt_tokens", f"prompt tokens (n={r['fixed_n']})"),
                                  (axes[1], "by_n", "n", f"group size n ({r['fixed_prompt_tokens']} prompt tokens)")):
            for side, name in (("trl", "TRL"), ("shop_r1", "shop-r1")):
                ax.plot([row[x] for row in r[key]], [row[f"{side}_step_s"] for row in r[key]], marker="o", label=name)
            ax.set_xlabel(label)
            ax.set_ylabel("s/step (median)")
            ax.set_xlim(left=0)
            ax.set_ylim(bottom=0)
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "trl_scaling.png", dpi=110)
        plt.close(fig)
        made.append("trl_scaling.png")
    if r := results.get("reward_pool"):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([p["actors"] for p in r["pool"]], [p["responses_per_s"] for p in r["pool"]], marker="o",
                label="reward pool")
        ax.axhline(r["direct_responses_per_s"], color="gray", ls="--", label="in-driver")
        ax.set_xlabel("reward actors")
        ax.set_ylabel("responses/s")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "reward_pool_scaling.png", dpi=110)
        plt.close(fig)
        made.append("reward_pool_scaling.png")
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SUITE)}")
    parser.add_argument("--quick", action="store_true", help="small sizes, tiny model only (a smoke test)")
    parser.add_argument("--out", default="", help="default: benchmarks/results/<machine>")
    args = parser.parse_args()
    names = [n for n in (args.only.split(",") if args.only else SUITE) if n]
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        raise SystemExit(f"run_suite: unknown benchmark(s) {unknown}; known: {list(SUITE)}")
    if args.quick:
        names = [n for n in names if n not in QUICK_SKIPS]
    info = machine()
    out = Path(args.out) if args.out else HERE / "results" / info["name"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "machine.json").write_text(json.dumps(info, indent=2) + "\n")
    results_path = out / "results.json"
    results: dict = {}
    seconds: dict[str, float] = {}
    for name in names:
        script, full, quick = SUITE[name]
        print(f"==> {name}", flush=True)
        start = time.perf_counter()
        results[name] = run_child([str(HERE / script), *(quick if args.quick else full)],
                                  timeout_s=TIMEOUT_S.get(name, 3600))
        seconds[name] = time.perf_counter() - start
        print(f"<== {name} in {seconds[name]:.0f}s", flush=True)
        # Written after every benchmark: a crash later in the suite keeps what was measured.
        results_path.write_text(json.dumps({"machine": info, "quick": args.quick, "seconds": seconds,
                                            "results": results}, indent=2) + "\n")
    plots = write_plots(out, results)
    write_summary(out, info, results, seconds, plots)
    print((out / "README.md").read_text())


if __name__ == "__main__":
    main()
