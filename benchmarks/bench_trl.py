"""A peer: TRL's `GRPOTrainer` against shop-r1's GRPO on the same model, prompts, group size, steps and reward.

A fair race (issue #11): each side runs in a process of its own, one after the other, on the whole machine, with
the same settings, and each side reports the settings it actually ran with, measured in its own processes (for
shop-r1 inside the learner and engine actors, while they work). `settings` in the result puts them side by side:
- threads: OMP_NUM_THREADS and torch.set_num_threads = --threads (default: every core) on both sides; shop-r1's
  learner and engine actors each reserve that many Ray CPUs, so Ray gives each actor OMP_NUM_THREADS = all cores
  (they take turns: generate, then update). Reported: torch.get_num_threads() in TRL's process and in our actors;
- dtype fp32 on CPU (bf16 on CUDA) for the policy and the reference, both loaded; β, clip ε, learning rate
  (constant), AdamW (torch, no weight decay, gradient clip 1.0), gradient checkpointing off on both (TRL's default
  is on: turned off here);
- loss: TRL's loss_type="dapo" (the per-token loss summed over every completion token of the batch, divided by
  their count: one process, no gradient accumulation) is rl.loss="dapo", a global token mean;
  advantages (r - mean) / std per group on both;
- the same prompts in the same steps: TRL walks the dataset in order (shuffle_dataset=False) and shop-r1's list is
  arranged so its seeded sampler takes the same prompts at each step; the prompt tokens of every step are counted on
  both sides;
- the same n, completion length, temperature (1) and reward: the Shop-R1 hybrid reward without its self-certainty
  term (TRL does not hand per-token logprobs to reward functions, so α·s(r) is off on both sides, and shop-r1 asks
  its engine for no top-k logprobs and runs no self-certainty forward).
Differences by design (rows marked so): TRL generates with HF `generate` in the training process; shop-r1 with vLLM
(prefix caching) in a Ray actor, and updates with DeepSpeed ZeRO-2 with the group's prompt encoded once.

Per side: the start-up, the warm-up step (step 1, untimed), then per timed step the step time, samples/s and
generated tokens/s (median, quartiles, range) and the time per stage (TRL: HF generate, reward, the rest =
logprob recomputation + reference + backward + optimizer; shop-r1: its `timing/*` stages), and peak memory (RSS).
Without gradient checkpointing TRL holds the activations of all P x n sequences, each with its own prompt copy, at
once: SmolLM2 at 2 x 4 x ~1.1k tokens needs ~10 GiB or more by our estimate (run it on a quiet machine).

`--scaling`: the race at growing prompt length (--scaling-lengths at G = --n) and growing G (--scaling-groups at
--scaling-prompt-tokens), --scaling-steps steps per point (default 3: 1 warm-up + 2 timed, indicative), prompts cut
to exact lengths (common.fixed_length_prompts).

`--repeats R --variants shared_off,prefix_cache_off,trl_vllm`: where the margin comes from. Every side runs R times,
alternately (trl, its variants, shop_r1, its variants; then again), so load drift hits all alike: shop-r1 with the
shared-prompt encoding off (`learner.shared_prompt=false`, every completion with its own prompt copy, as TRL) and
with vLLM's prefix caching off (`rollout.enable_prefix_caching=false`); TRL with its vLLM generation
(`use_vllm=True, vllm_mode="colocate"`), or the error that stopped it on this machine. Per side: the median over
repeats of its median step time, the range, and per shop-r1 side its speedup over TRL paired by repeat; the peak RSS
of every side, and a note when one came within 15 % of the machine's memory.

Run: python benchmarks/bench_trl.py --model smollm2|tiny|DIR [--prompts 2] [--n 4] [--steps 6] [--prompt-tokens 1024]
     python benchmarks/bench_trl.py --scaling --model tiny --prompts 1
     python benchmarks/bench_trl.py --model tiny --prompt-tokens 1024 --repeats 3 \
         --variants shared_off,prefix_cache_off,trl_vllm
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BenchPrompt, chat_prompts, emit, fixed_length_prompts, model_dir, run_child, spread

LR, BETA, EPS, TEMPERATURE = 1e-6, 0.001, 0.2, 1.0
TRL_LOSS_TYPE = "dapo"
LOSS_MEANING = {"dapo": "global token mean", "bnpo": "global token mean", "grpo": "per-sequence mean",
                "dr_grpo": "token sum / (responses x max new tokens)", "gspo": "per-sequence mean, sequence ratio"}
# Setting -> whether it is meant to be equal on both sides ("matched") or differs by design. Each side reports
# every one; a per-actor value (shop-r1) is a dict actor -> value.
SETTINGS: dict[str, str] = {
    "threads (torch.get_num_threads)": "matched", "OMP_NUM_THREADS": "matched", "dtype": "matched",
    "reference model": "matched", "gradient checkpointing": "matched", "loss": "matched", "KL beta": "matched",
    "clip eps (low/high)": "matched", "learning rate": "matched", "optimizer": "matched", "group size n": "matched",
    "prompts per step": "matched", "max new tokens": "matched", "temperature": "matched",
    "prompt tokens per step (median)": "matched", "generation/update overlap": "matched", "generation": "by design",
    "update": "by design"}
SHOP_R1_STAGES = ("rollout", "reward", "advantages", "update", "weight_sync", "other")
"""The `timing/*` stages of a synchronous GRPO step, which sum to `timing/step` (shop_r1/train.py)."""
STAGE_ORDER = ("generate", "rollout", "reward", "rest", "advantages", "update", "weight_sync", "other")  # both
SIDE_TIMEOUT_S = 3 * 3600
VARIANTS: dict[str, tuple[str, list[str]]] = {  # name -> (side, what it changes)
    "shared_off": ("shop_r1", ["learner.shared_prompt=false"]),
    "prefix_cache_off": ("shop_r1", ["rollout.enable_prefix_caching=false"]),
    "trl_vllm": ("trl", []),  # GRPOConfig(use_vllm=True, vllm_mode="colocate")
}


def all_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _dtype() -> str:
    import torch

    return "bfloat16" if torch.cuda.is_available() else "float32"


def _prompts(args: argparse.Namespace) -> tuple[str, list[BenchPrompt]]:
    model = model_dir(args.model, Path(args.tmp))
    num = args.prompts * args.steps
    if args.prompt_tokens:
        return model, fixed_length_prompts(model, num, args.prompt_tokens)
    return model, chat_prompts(model, num, args.max_prompt_tokens)


def _reward_cfg():
    from shop_r1.config import RewardConfig

    return RewardConfig(rationale_reward=False)


def peak_rss_gib() -> float:
    """This process's peak resident memory so far (Linux: ru_maxrss is in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def enum_value(value: Any) -> Any:
    return getattr(value, "value", value)


def one_value(values: list) -> Any:
    """The value every observation agreed on, or the sorted distinct values when they did not."""
    distinct = sorted(set(values), key=str)
    return distinct[0] if len(distinct) == 1 else distinct


def summarize(side: str, steps: list[dict], batch: int, setup_s: float, warmup_s: float, settings: dict) -> dict:
    """One side's result from its timed steps ({step_s, generated_tokens, prompt_tokens, stages: {stage: s}}):
    medians (the headline figures), spreads, the median time and the share of the step time of each stage."""
    if not steps:
        raise ValueError(f"{side}: no timed step (run at least 2 steps: the first is a warm-up)")
    step_s = [s["step_s"] for s in steps]
    seen = list(dict.fromkeys(k for s in steps for k in s["stages"]))
    stages = [k for k in STAGE_ORDER if k in seen] + [k for k in seen if k not in STAGE_ORDER]
    figures = {"step_s": step_s, "samples_per_s": [batch / t for t in step_s],
               "generated_tokens_per_s": [s["generated_tokens"] / s["step_s"] for s in steps]}
    spreads = {k: spread(v) for k, v in figures.items()}
    prompt_tokens = spread([s["prompt_tokens"] for s in steps])["median"]
    return {"side": side, "setup_s": setup_s, "warmup_step_s": warmup_s, "timed_steps": len(steps),
            **{k: v["median"] for k, v in spreads.items()}, "spread": spreads, "prompt_tokens_per_step": prompt_tokens,
            "stage_s": {k: spread([s["stages"].get(k, 0.0) for s in steps])["median"] for k in stages},
            "share": {k: sum(s["stages"].get(k, 0.0) for s in steps) / sum(step_s) for k in stages},
            "steps": steps, "settings": {**settings, "prompt tokens per step (median)": prompt_tokens}}


def _values(value: Any) -> set[str]:
    """The distinct values a setting took (each actor's, for a per-actor dict), notes in parentheses dropped."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]
    return {str(v).split(" (")[0] for v in items}


def settings_rows(trl: dict, ours: dict) -> list[dict]:
    """The side-by-side table: one row per setting; `same`: both sides ran with the same value (None: a side did
    not report it)."""
    return [{"setting": k, "kind": kind, "trl": trl.get(k, "not reported"), "shop_r1": ours.get(k, "not reported"),
             "same": _values(trl[k]) == _values(ours[k]) if k in trl and k in ours else None}
            for k, kind in SETTINGS.items()]


# ------------------------------------------------------------------------------------------------ TRL's side


def side_trl(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from shop_r1.reward.scorer import score_response
    from shop_r1.types import Action

    model, prompts = _prompts(args)
    cfg = _reward_cfg()
    live = {"generate": 0.0, "reward": 0.0, "generated_tokens": 0, "prompt_tokens": 0}

    def shop_r1_reward(prompts, completions, completion_ids, target, **_):
        start = time.perf_counter()
        out = [score_response(c, Action.from_dict(json.loads(t)), cfg).total for c, t in zip(completions, target)]
        live["reward"] += time.perf_counter() - start
        live["generated_tokens"] += sum(len(ids) for ids in completion_ids)
        return out

    batch = args.prompts * args.n
    on_gpu = torch.cuda.is_available()
    config = GRPOConfig(output_dir=str(Path(args.tmp) / "trl"), use_cpu=not on_gpu, bf16=on_gpu,
                        model_init_kwargs={"dtype": _dtype()}, per_device_train_batch_size=batch,
                        num_generations=args.n, steps_per_generation=1, num_iterations=1,
                        gradient_accumulation_steps=1, max_completion_length=args.max_new_tokens, max_steps=args.steps,
                        learning_rate=LR, lr_scheduler_type="constant", optim="adamw_torch", weight_decay=0.0,
                        max_grad_norm=1.0, beta=BETA, epsilon=EPS, loss_type=TRL_LOSS_TYPE, scale_rewards="group",
                        gradient_checkpointing=False, temperature=TEMPERATURE, shuffle_dataset=False,
                        logging_steps=1, report_to="none", save_strategy="no", seed=0, dataloader_num_workers=0,
                        disable_dropout=True,
                        **({"use_vllm": True, "vllm_mode": "colocate"} if args.variant == "trl_vllm" else {}))
    dataset = Dataset.from_list([{"prompt": p.text, "target": json.dumps(p.target.to_dict())} for p in prompts])
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=shop_r1_reward, args=config, train_dataset=dataset)
    setup_s = time.perf_counter() - t0
    generate = trainer._generate_single_turn

    def timed_generate(prompt_ids, *a, **k):  # observation only: the trainer's own generation, timed and counted
        start = time.perf_counter()
        live["prompt_tokens"] += sum(len(p) for p in dict.fromkeys(tuple(p) for p in prompt_ids))  # distinct
        try:
            return generate(prompt_ids, *a, **k)
        finally:
            live["generate"] += time.perf_counter() - start

    trainer._generate_single_turn = timed_generate
    marks: list[dict] = []

    class Marks(TrainerCallback):
        def on_step_end(self, *_, **__):
            marks.append({"t": time.perf_counter(), "threads": torch.get_num_threads(), **live})

    trainer.add_callback(Marks())
    begin = {"t": time.perf_counter(), **live}
    trainer.train()
    steps = []
    for a, b in itertools.pairwise(marks):
        seconds, gen, rew = b["t"] - a["t"], b["generate"] - a["generate"], b["reward"] - a["reward"]
        steps.append({"step_s": seconds, "generated_tokens": b["generated_tokens"] - a["generated_tokens"],
                      "prompt_tokens": b["prompt_tokens"] - a["prompt_tokens"],
                      "stages": {"generate": gen, "reward": rew, "rest": seconds - gen - rew}})
    settings = _trl_settings(trainer, one_value([m["threads"] for m in marks]))
    out = summarize("trl", steps, batch, setup_s, marks[0]["t"] - begin["t"] if marks else 0.0, settings)
    out["peak_rss_gib"] = peak_rss_gib()  # policy, reference, optimizer and activations all in this process
    return out


def _trl_settings(trainer: Any, threads: Any) -> dict:
    """The settings TRL's trainer ran with, read from the trainer and its models (see SETTINGS)."""
    policy, ref, args = trainer.model, trainer.ref_model, trainer.args
    return {
        "threads (torch.get_num_threads)": threads, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
        "dtype": str(next(policy.parameters()).dtype).removeprefix("torch."),
        "reference model": str(next(ref.parameters()).dtype).removeprefix("torch.") if ref is not None else "none",
        "gradient checkpointing": bool(policy.is_gradient_checkpointing),
        "loss": f"{LOSS_MEANING.get(trainer.loss_type, trainer.loss_type)} (loss_type={trainer.loss_type})",
        "KL beta": trainer.beta, "clip eps (low/high)": f"{trainer.epsilon_low}/{trainer.epsilon_high}",
        "learning rate": f"{args.learning_rate} ({enum_value(args.lr_scheduler_type)})",
        "optimizer": f"AdamW wd {args.weight_decay} clip {args.max_grad_norm} (optim={enum_value(args.optim)})",
        "group size n": trainer.num_generations,
        "prompts per step": args.per_device_train_batch_size // trainer.num_generations,
        "max new tokens": trainer.max_completion_length, "temperature": trainer.temperature,
        "generation/update overlap": "none (generate, then update)",
        "generation": "HF generate, in the training process (no prefix sharing)",
        "update": "accelerate, plain torch (each completion with its own prompt copy)"}


# -------------------------------------------------------------------------------------------- shop-r1's side


def observed(cls: type, method: str, log: str, facts: Callable[[Any], dict]) -> type:
    """`cls` (an actor class) whose `method` first appends, to the file `log`, what its process runs with: torch
    threads, OMP_NUM_THREADS and `facts(self)`. Observation only; the method itself is unchanged."""

    def work(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        note = {"actor": cls.__name__, "pid": os.getpid(), "torch_threads": torch.get_num_threads(),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"), "peak_rss_gib": peak_rss_gib(),
                **facts(self)}
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(note) + "\n")
        return getattr(cls, method)(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {method: work})


def _engine_facts(engine: Any) -> dict:
    return {"dtype": str(engine.llm.llm_engine.model_config.dtype).removeprefix("torch.")}


def _learner_facts(learner: Any) -> dict:
    module, ref = learner.backend.engine.module, learner.reference
    return {"dtype": str(next(module.parameters()).dtype).removeprefix("torch."),
            "reference": str(next(ref.parameters()).dtype).removeprefix("torch.") if ref is not None else "none",
            "gradient_checkpointing": bool(module.is_gradient_checkpointing)}


def _in_sampler_order(items: list, per_step: int, seed: int) -> list:
    """`items` placed so that shop-r1's seeded PromptSampler takes items[0:per_step] at step 1, the next at step 2,
    ... (the order TRL walks its dataset in, with shuffle_dataset=False)."""
    from shop_r1.data.sampler import PromptSampler

    sampler, order = PromptSampler(len(items), per_step, seed), []
    while len(order) < len(items):
        order.extend(sampler.next_batch())
    placed = [None] * len(items)
    for item, slot in zip(items, order):
        placed[slot] = item
    return placed


def _shop_r1_overrides(args: argparse.Namespace, run: Path, context: int) -> list[str]:
    t = args.threads
    return [
        f"run_dir={run}", f"rl.steps={args.steps}", f"rollout.group_size={args.n}",
        f"rl.global_batch_size={args.prompts * args.n}", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"rl.lr={LR}", f"rl.kl_beta={BETA}", f"rl.clip_eps={EPS}", f"rollout.temperature={TEMPERATURE}",
        "rl.loss=dapo", "rl.async_level=0", "learner.gradient_checkpointing=false",
        f"learner.dtype={_dtype()}", f"rollout.dtype={_dtype()}", "learner.weight_decay=0", "learner.grad_clip=1.0",
        # The self-certainty term is off (TRL cannot compute it): no top-k logprobs, no exact-s(r) forward.
        "reward.rationale_reward=false", "reward.self_certainty.source=topk_logprobs", "rollout.top_k_logprobs=0",
        # Learner and engine each reserve every core, so Ray sets OMP_NUM_THREADS = all cores in both (they take
        # turns); the cluster advertises room for both plus the reward workers.
        f"learner.num_cpus_per_rank={t}", f"rollout.num_cpus_per_engine={t}", f"ray.num_cpus={2 * t + 2}",
        "logging.wandb=false", "logging.console_every=0", f"rl.checkpoint_every={10**6}",
        f"model.max_context_tokens={context}", "rollout.kv_cache_gib=2"]


def _shop_r1_settings(cfg: Any, notes: list[dict]) -> dict:
    """The settings shop-r1 ran with: threads, dtypes and checkpointing as its actors observed them (`observed`),
    the rest from the resolved config (see SETTINGS)."""

    def per_actor(key: str) -> dict:
        return {name: one_value([n[key] for n in notes if n["actor"] == actor])
                for name, actor in (("learner", "LearnerRank"), ("engine", "VLLMEngine"))}

    learner = [n for n in notes if n["actor"] == "LearnerRank"]
    on = {True: "on", False: "off"}
    return {
        "threads (torch.get_num_threads)": per_actor("torch_threads"), "OMP_NUM_THREADS": per_actor("omp_num_threads"),
        "dtype": per_actor("dtype"), "reference model": one_value([n["reference"] for n in learner]),
        "gradient checkpointing": one_value([n["gradient_checkpointing"] for n in learner]),
        "loss": f"{LOSS_MEANING[cfg.rl.loss]} (rl.loss={cfg.rl.loss})",
        "KL beta": cfg.rl.kl_beta,
        "clip eps (low/high)": f"{cfg.rl.clip_eps}/{cfg.rl.clip_eps_high or cfg.rl.clip_eps}",
        "learning rate": f"{cfg.rl.lr} (constant)",
        "optimizer": f"AdamW wd {cfg.learner.weight_decay} clip {cfg.learner.grad_clip} (torch.optim.AdamW)",
        "group size n": cfg.rollout.group_size, "prompts per step": cfg.rl.global_batch_size // cfg.rollout.group_size,
        "max new tokens": cfg.rollout.max_new_tokens, "temperature": cfg.rollout.temperature,
        "generation/update overlap": "none (rl.async_level=0)" if cfg.rl.async_level == 0
        else f"one-step-off (rl.async_level={cfg.rl.async_level})",
        "generation": f"vLLM in a Ray actor (prefix caching {on[cfg.rollout.enable_prefix_caching]})",
        "update": f"DeepSpeed ZeRO-{cfg.learner.zero_stage} in a Ray actor (shared prompt "
                  f"{on[cfg.learner.shared_prompt]})"}


def side_shop_r1(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from shop_r1.config import load_config
    from shop_r1.distributed.runtime import start_ray
    from shop_r1.learner.rank import LearnerRank
    from shop_r1.rollout.vllm_engine import VLLMEngine
    from shop_r1.train import run_grpo
    from shop_r1.types import Prompt

    model, texts = _prompts(args)
    tok = AutoTokenizer.from_pretrained(model)
    ids = [tuple(tok(p.text, add_special_tokens=False)["input_ids"]) for p in texts]
    run = Path(args.tmp) / "shop_r1"
    context = max(len(i) for i in ids) + args.max_new_tokens
    extra = VARIANTS[args.variant][1] if args.variant else []
    cfg = load_config(None, _shop_r1_overrides(args, run, context) + extra)
    prompts = _in_sampler_order([Prompt(example_id=str(i), token_ids=ids[i], target=p.target)
                                 for i, p in enumerate(texts)], args.prompts, cfg.seed)
    log = run / "actor_threads.jsonl"
    run.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runtime = start_ray(cfg.ray)
    ray_init_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        run_grpo(cfg, model, prompts, run / "grpo", local=False, pad_id=tok.pad_token_id or 0,
                 engine_cls=observed(VLLMEngine, "generate", str(log), _engine_facts),
                 learner_cls=observed(LearnerRank, "grpo_step", str(log), _learner_facts))
        wall = time.perf_counter() - t0
    finally:
        runtime.shutdown()
    rows = [json.loads(x) for x in (run / "metrics_grpo.jsonl").read_text().splitlines()]
    taken = [json.loads(x)["example_ids"] for x in (run / "grpo" / "batches.jsonl").read_text().splitlines()]
    batch = args.prompts * args.n
    steps = [{"step_s": r["timing/step"], "generated_tokens": r["rollout/response_tokens_mean"] * batch,
              "prompt_tokens": sum(len(ids[int(e)]) for e in took),
              "stages": {k: r[f"timing/{k}"] for k in SHOP_R1_STAGES if f"timing/{k}" in r}}
             for r, took in zip(rows, taken)]
    notes = [json.loads(x) for x in log.read_text().splitlines()]
    settings = _shop_r1_settings(cfg, notes)
    out = summarize("shop_r1", steps[1:], batch, wall - sum(s["step_s"] for s in steps), steps[0]["step_s"]
                    if steps else 0.0, settings)
    # Same prompts at the same step as TRL: step k must have taken prompts k*P .. k*P+P-1.
    out["prompt_order_as_trl"] = all(sorted(map(int, took)) == list(range(k * args.prompts, (k + 1) * args.prompts))
                                     for k, took in enumerate(taken))
    out["ray_init_s"] = ray_init_s
    # shop-r1's own record of the same (read once, after the actors start), where this version logs it.
    out["threads_metrics"] = {k: v for k, v in rows[0].items() if k.startswith("threads/")} if rows else {}
    # Each actor's peak so far, as noted when its last step began (the last step's own peak is not seen).
    out["peak_rss_gib"] = {name: max((n["peak_rss_gib"] for n in notes if n["actor"] == actor), default=0.0)
                           for name, actor in (("learner", "LearnerRank"), ("engine", "VLLMEngine"))}
    return out


# ------------------------------------------------------------------------------------------------ the races


def race(args: argparse.Namespace, n: int, prompt_tokens: int, steps: int, tmp: str) -> dict:
    """Both sides, one after the other, on the same inputs; ratios are ours over TRL's (higher is better)."""
    tmp = tempfile.mkdtemp(prefix=f"race_p{prompt_tokens}_n{n}_", dir=tmp)  # each race its own run folders
    child = [__file__, "--model", args.model, "--prompts", str(args.prompts), "--n", str(n), "--steps", str(steps),
             "--max-new-tokens", str(args.max_new_tokens), "--max-prompt-tokens", str(args.max_prompt_tokens),
             "--prompt-tokens", str(prompt_tokens), "--threads", str(args.threads), "--tmp", tmp]
    env = {"OMP_NUM_THREADS": str(args.threads)}
    theirs = run_child([*child, "--side", "trl"], timeout_s=SIDE_TIMEOUT_S, env=env)
    ours = run_child([*child, "--side", "shop_r1"], timeout_s=SIDE_TIMEOUT_S, env=env)
    return {"model": args.model, "prompts_per_step": args.prompts, "n": n, "steps": steps, "warmup_steps": 1,
            "timed_steps": steps - 1, "max_new_tokens": args.max_new_tokens,
            "max_prompt_tokens": args.max_prompt_tokens, "prompt_tokens": prompt_tokens or None,
            "threads": args.threads, "settings": settings_rows(theirs["settings"], ours["settings"]),
            "trl": theirs, "shop_r1": ours,
            "samples_per_s_ratio": ours["samples_per_s"] / theirs["samples_per_s"],
            "generated_tokens_per_s_ratio": ours["generated_tokens_per_s"] / theirs["generated_tokens_per_s"],
            "speedup": theirs["step_s"] / ours["step_s"]}


def _side_name(side: str, variant: str) -> str:
    return f"{side}[{variant}]" if variant else side


def race_repeated(args: argparse.Namespace, tmp: str) -> dict:
    """Every side (TRL, shop-r1 and the --variants) --repeats times, alternately, on the same inputs."""
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"bench_trl: unknown --variants {unknown}; known: {sorted(VARIANTS)}")
    if args.no_trl and any(VARIANTS[v][0] == "trl" for v in variants):
        raise SystemExit("bench_trl: --no-trl leaves out TRL's side, and with it the TRL variants asked for")
    order = ([] if args.no_trl else [("trl", "")]) \
        + [(VARIANTS[v][0], v) for v in variants if VARIANTS[v][0] == "trl"] + [("shop_r1", "")] \
        + [(VARIANTS[v][0], v) for v in variants if VARIANTS[v][0] == "shop_r1"]
    runs: dict[str, list[dict]] = {_side_name(s, v): [] for s, v in order}
    errors: dict[str, str] = {}
    for r in range(args.repeats):
        for side, variant in order:
            name = _side_name(side, variant)
            if name in errors:
                continue
            work = tempfile.mkdtemp(prefix=f"rep{r}_{side}_{variant or 'base'}_", dir=tmp)
            child = [__file__, "--model", args.model, "--prompts", str(args.prompts), "--n", str(args.n),
                     "--steps", str(args.steps), "--max-new-tokens", str(args.max_new_tokens),
                     "--max-prompt-tokens", str(args.max_prompt_tokens), "--prompt-tokens", str(args.prompt_tokens),
                     "--threads", str(args.threads), "--tmp", work, "--side", side, "--variant", variant]
            print(f"[bench_trl] repeat {r + 1}/{args.repeats}: {name}", file=sys.stderr, flush=True)
            try:
                env = {"OMP_NUM_THREADS": str(args.threads)}
                runs[name].append(run_child(child, timeout_s=SIDE_TIMEOUT_S, env=env))
            except RuntimeError as exc:  # a side that cannot run here (e.g. TRL's vLLM path on CPU) says why
                errors[name] = str(exc)[-1500:]
            shutil.rmtree(work, ignore_errors=True)
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    sides, notes = {}, []
    for name, reps in runs.items():
        if not reps:
            continue
        medians = [x["step_s"] for x in reps]
        peaks = [x["peak_rss_gib"] if isinstance(x["peak_rss_gib"], (int, float))
                 else sum(x["peak_rss_gib"].values()) for x in reps]
        sides[name] = {"step_s": spread(medians), "samples_per_s": spread([x["samples_per_s"] for x in reps]),
                       "prompt_tokens_per_step": reps[0]["prompt_tokens_per_step"],
                       "stage_s": reps[-1]["stage_s"], "peak_rss_gib": max(peaks), "repeats": reps}
        if max(peaks) > 0.85 * ram_gib:
            notes.append(f"{name} peaked at {max(peaks):.1f} GiB of {ram_gib:.1f} GiB: within 15 % of the memory")
    speedups, over_shop_r1 = {}, {}
    if "shop_r1" in sides:  # each shop-r1 variant's step time over shop-r1's own, paired by repeat
        base = [x["step_s"] for x in runs["shop_r1"]]
        for name in sides:
            if name.startswith("shop_r1["):
                over_shop_r1[name] = spread([x["step_s"] / b for b, x in zip(base, runs[name])])
    if "trl" in sides:
        base = [x["step_s"] for x in runs["trl"]]
        for name in sides:
            if name.startswith("shop_r1"):
                paired = [b / x["step_s"] for b, x in zip(base, runs[name])]
                speedups[name] = spread(paired)
    return {"mode": "race_repeated", "model": args.model, "prompts_per_step": args.prompts, "n": args.n,
            "steps": args.steps, "warmup_steps": 1, "max_new_tokens": args.max_new_tokens,
            "prompt_tokens": args.prompt_tokens or None, "threads": args.threads, "repeats": args.repeats,
            "order": [_side_name(s, v) for s, v in order], "ram_gib": ram_gib,
            "speedup_over_trl": speedups, "step_over_shop_r1": over_shop_r1, "sides": sides, "errors": errors,
            "memory_notes": notes}


def scaling_row(result: dict) -> dict:
    """One point of the scaling table: medians of both sides on the same inputs."""
    t, o = result["trl"], result["shop_r1"]
    return {"prompt_tokens": result["prompt_tokens"], "n": result["n"],
            "trl_prompt_tokens_per_step": t["prompt_tokens_per_step"],
            "shop_r1_prompt_tokens_per_step": o["prompt_tokens_per_step"],
            "trl_step_s": t["step_s"], "shop_r1_step_s": o["step_s"],
            "trl_generated_tokens_per_s": t["generated_tokens_per_s"],
            "shop_r1_generated_tokens_per_s": o["generated_tokens_per_s"], "speedup": result["speedup"]}


def scaling(args: argparse.Namespace, tmp: str) -> dict:
    lengths = [int(x) for x in args.scaling_lengths.split(",")]
    groups = [int(x) for x in args.scaling_groups.split(",")]
    points = list(dict.fromkeys([(length, args.n) for length in lengths]
                                + [(args.scaling_prompt_tokens, g) for g in groups]))
    results = {}
    for length, n in points:
        print(f"[bench_trl] scaling: prompt tokens {length}, n={n}", file=sys.stderr, flush=True)
        results[(length, n)] = race(args, n, length, args.scaling_steps, tmp)
    return {"mode": "scaling", "model": args.model, "prompts_per_step": args.prompts,
            "max_new_tokens": args.max_new_tokens, "threads": args.threads, "warmup_steps": 1,
            "timed_steps": args.scaling_steps - 1,
            "note": f"{args.scaling_steps - 1} timed step(s) after 1 warm-up per point (fewer than the main race): "
                    "indicative",
            "prompts": "fixed length: whole-session synthetic-shop prompts cut at the token level, system prompt "
                       "head + current-page tail kept (common.fixed_length_prompts)",
            "fixed_n": args.n, "fixed_prompt_tokens": args.scaling_prompt_tokens,
            "by_prompt_tokens": [scaling_row(results[(length, args.n)]) for length in lengths],
            "by_n": [scaling_row(results[(args.scaling_prompt_tokens, g)]) for g in groups],
            "points": [results[p] for p in points]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny | smollm2 | a model folder")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (group size)")
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps (the first is an untimed warm-up)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=1400,
                        help="budget of the natural prompts (older pages dropped to fit), when --prompt-tokens is 0")
    parser.add_argument("--prompt-tokens", type=int, default=0,
                        help="every prompt cut to exactly this many tokens (0: natural prompts up to the budget)")
    parser.add_argument("--threads", type=int, default=all_cores(), help="threads of each side (default: all cores)")
    parser.add_argument("--scaling", action="store_true", help="the scaling sweep instead of one race")
    parser.add_argument("--scaling-lengths", default="512,1024,2048,4096", help="prompt tokens, at G = --n")
    parser.add_argument("--scaling-groups", default="4,8,16", help="group sizes, at --scaling-prompt-tokens")
    parser.add_argument("--scaling-prompt-tokens", type=int, default=1024)
    parser.add_argument("--scaling-steps", type=int, default=3, help="steps per point (the first a warm-up)")
    parser.add_argument("--repeats", type=int, default=1, help="alternating repeats of every side (with --variants)")
    parser.add_argument("--variants", default="", help=f"comma-separated, of {sorted(VARIANTS)}")
    parser.add_argument("--no-trl", action="store_true",
                        help="with --variants: shop-r1 and its variants only (TRL's SmolLM2 side runs tens of "
                             "minutes); each variant's step is then read against shop-r1's, paired by repeat")
    parser.add_argument("--side", choices=("trl", "shop_r1"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", default="", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    if args.side is not None:
        emit((side_trl if args.side == "trl" else side_shop_r1)(args), args.json_out)
        return
    if min(args.steps, args.scaling_steps) < 2:
        raise SystemExit("bench_trl: --steps and --scaling-steps must be >= 2 (the first step is a warm-up)")
    tmp = tempfile.mkdtemp(prefix="bench_trl_")
    try:  # the runs' folders (a SmolLM2 run leaves checkpoints of ~2 GB) go once both sides have reported
        if args.scaling:
            result = scaling(args, tmp)
        elif args.repeats > 1 or args.variants or args.no_trl:
            result = race_repeated(args, tmp)
        else:
            result = race(args, args.n, args.prompt_tokens, args.steps, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    emit(result, args.json_out)


if __name__ == "__main__":
    main()
