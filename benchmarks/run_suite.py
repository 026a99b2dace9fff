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

# name -> (script, full-run args, quick args). Sizes for full runs are chosen so the whole suite finishes in well
# under an hour on a 2-core CPU machine; on GPUs pass bigger sizes to the scripts directly.
SUITE: dict[str, tuple[str, list[str], list[str]]] = {
    "rouge": ("bench_rouge.py", ["--pairs", "20000"], ["--pairs", "2000"]),
    "reward_pool": ("bench_reward_pool.py", ["--responses", "4000", "--actors", "1,2,4"],
                    ["--responses", "600", "--actors", "1,2"]),
    "rollout": ("bench_rollout.py", ["--prompts", "16", "--n", "4", "--max-new-tokens", "64"],
                ["--prompts", "4", "--n", "2", "--max-new-tokens", "16"]),
    "learner": ("bench_learner.py", ["--batch", "8", "--prompt-tokens", "512", "--completion-tokens", "64"],
                ["--batch", "4", "--prompt-tokens", "128", "--completion-tokens", "16", "--steps", "2"]),
    "weight_sync": ("bench_weight_sync.py", ["--steps", "4"], ["--steps", "2"]),
    "trl_smollm2": ("bench_trl.py", ["--model", "smollm2", "--prompts", "2", "--n", "4", "--steps", "3",
                                     "--max-new-tokens", "48", "--max-prompt-tokens", "1200"], []),
    "trl_tiny": ("bench_trl.py", ["--model", "tiny", "--prompts", "2", "--n", "4", "--steps", "4",
                                  "--max-new-tokens", "48", "--max-prompt-tokens", "1200"],
                 ["--model", "tiny", "--prompts", "1", "--n", "4", "--steps", "2", "--max-new-tokens", "16",
                  "--max-prompt-tokens", "1200"]),
}
QUICK_SKIPS = {"trl_smollm2"}


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
                     f"bare DeepSpeed {r['bare_tokens_per_s']:,.0f} tokens/s", f"{r['ratio_group_over_bare']:.2f}x"))
    if r := results.get("weight_sync"):
        rows.append(("Weight sync", f"{r['weight_sync_s'] * 1e3:.1f} ms ({r['weight_sync_gb_per_s']:.2f} GB/s)",
                     f"raw broadcast {r['raw_broadcast_s'] * 1e3:.1f} ms ({r['raw_broadcast_gb_per_s']:.2f} GB/s)",
                     f"{r['sync_over_raw']:.1f}x the time"))
        rows.append(("GRPO step outside the 4 stages", f"{100 * r['share_outside_stages']:.1f}% of "
                     f"{r['step_s']:.2f} s", "-", "-"))
    for key, label in (("trl_smollm2", "SmolLM2-135M"), ("trl_tiny", "tiny Qwen2")):
        if r := results.get(key):
            rows.append((f"GRPO vs TRL, {label}: samples/s", f"{r['shop_r1']['samples_per_s']:.3f}",
                         f"TRL {r['trl']['samples_per_s']:.3f}", f"{r['samples_per_s_ratio']:.2f}x"))
            rows.append((f"GRPO vs TRL, {label}: gen. tokens/s", f"{r['shop_r1']['generated_tokens_per_s']:.1f}",
                         f"TRL {r['trl']['generated_tokens_per_s']:.1f}", f"{r['generated_tokens_per_s_ratio']:.2f}x"))
    return rows


def write_summary(out: Path, info: dict, results: dict, seconds: dict[str, float], plots: list[str]) -> None:
    lines = [f"# Benchmarks on `{info['name']}`", "",
             f"{info['cpu_model']}, {info['cpu_cores']} cores ({info['cpu_isa']}), {info['ram_gib']} GiB RAM"
             + (f", GPUs: {', '.join(info['gpus'])}" if info.get("gpus") else ", no GPU") + ".",
             f"torch {info['torch']}, vLLM {info['vllm']}, DeepSpeed {info['deepspeed']}, Ray {info['ray']}, "
             f"transformers {info['transformers']}, TRL {info['trl']}.", "",
             "Each ratio compares two things measured side by side in the same run (`results.json` has every number;"
             " `run_suite.py` the sizes).", "",
             "| benchmark | shop-r1 | reference | ratio |", "|---|---:|---:|---:|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in summary_rows(results)]
    for key in ("trl_smollm2", "trl_tiny"):
        if r := results.get(key):
            t, o = r["trl"]["share"], r["shop_r1"]["share"]
            lines += ["", f"Where a step's time goes ({key}: {r['prompts_per_step']} prompts x n={r['n']}, "
                      f"{r['max_new_tokens']} new tokens, prompts up to {r['max_prompt_tokens']} tokens): "
                      f"TRL {r['trl']['step_s']:.1f} s/step = " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in t.items())
                      + f"; shop-r1 {r['shop_r1']['step_s']:.1f} s/step = "
                      + ", ".join(f"{k} {100 * v:.0f}%" for k, v in o.items())
                      + f". Start-up: TRL {r['trl']['setup_s']:.0f} s, shop-r1 {r['shop_r1']['setup_s']:.0f} s."]
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
    for key in ("trl_smollm2", "trl_tiny"):
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
        results[name] = run_child([str(HERE / script), *(quick if args.quick else full)], timeout_s=3600)
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
