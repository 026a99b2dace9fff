"""A peer: TRL's `GRPOTrainer` against shop-r1's GRPO on the same model, prompts, group size, steps and reward.

Both sides get the same Shop-R1 RL examples (long page context; the chat template applied once, here, so both see
the same prompt text), the same number of prompts per step and samples per prompt (n), the same completion length,
the same learning rate, β and clip ε, and the same reward: the Shop-R1 hybrid reward without its self-certainty
term (TRL does not hand per-token logprobs to reward functions, so α·s(r) is off on both sides). Each side runs in a
process of its own, one after the other, on the whole machine. The first step is a warm-up and is not timed.

Reported per side: samples/s and generated tokens/s over the timed steps, the start-up time, and where a step's time
goes (theirs: HF `generate`, reward, the rest = logprob recomputation + reference + backward + optimizer; ours:
the stages of `timing/*`). Then the ratio ours/theirs.

Run: python benchmarks/bench_trl.py --model smollm2|tiny|DIR [--prompts 2] [--n 4] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, model_dir, rl_examples, run_child  # noqa: E402

LR, BETA, EPS = 1e-6, 0.001, 0.2


def _shared(args: argparse.Namespace) -> tuple[str, list, list[str]]:
    from transformers import AutoTokenizer

    from shop_r1.data.prompts import apply_chat_template

    model = model_dir(args.model, Path(args.tmp))
    examples = rl_examples(model, args.prompts * args.steps, args.max_prompt_tokens)
    tok = AutoTokenizer.from_pretrained(model)
    texts = [apply_chat_template(tok, ex.prompt, add_generation_prompt=True) for ex in examples]
    return model, examples, texts


def _reward_cfg():
    from shop_r1.config import RewardConfig

    return RewardConfig(rationale_reward=False)


def side_trl(args: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from shop_r1.reward.scorer import score_response
    from shop_r1.types import Action

    model, examples, texts = _shared(args)
    cfg = _reward_cfg()
    timers = {"generate": 0.0, "reward": 0.0, "tokens": 0}

    def shop_r1_reward(prompts, completions, completion_ids, target, **_):
        start = time.perf_counter()
        out = [score_response(c, Action.from_dict(json.loads(t)), cfg).total for c, t in zip(completions, target)]
        timers["reward"] += time.perf_counter() - start
        timers["tokens"] += sum(len(ids) for ids in completion_ids)
        return out

    batch = args.prompts * args.n
    config = GRPOConfig(output_dir=str(Path(args.tmp) / "trl"), use_cpu=not torch.cuda.is_available(),
                        bf16=torch.cuda.is_available(), per_device_train_batch_size=batch, num_generations=args.n,
                        steps_per_generation=1, num_iterations=1,
                        gradient_accumulation_steps=1, max_completion_length=args.max_new_tokens, max_steps=args.steps,
                        learning_rate=LR, beta=BETA, epsilon=EPS, temperature=1.0, logging_steps=1,
                        report_to="none", save_strategy="no", seed=0, dataloader_num_workers=0, disable_dropout=True)
    dataset = Dataset.from_list([{"prompt": t, "target": json.dumps(ex.target.to_dict())}
                                 for t, ex in zip(texts, examples)])
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=shop_r1_reward, args=config, train_dataset=dataset)
    setup_s = time.perf_counter() - t0
    generate = trainer._generate_single_turn

    def timed_generate(*a, **k):  # observation only: the trainer's own generation, timed
        start = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            timers["generate"] += time.perf_counter() - start

    trainer._generate_single_turn = timed_generate
    marks: list[dict] = []

    class Marks(TrainerCallback):
        def on_step_end(self, *_, **__):
            marks.append({"t": time.perf_counter(), **timers})

    trainer.add_callback(Marks())
    begin = {"t": time.perf_counter(), **timers}
    trainer.train()
    first, last = marks[0] if len(marks) > 1 else begin, marks[-1]
    timed_steps = len(marks) - 1 if len(marks) > 1 else len(marks)
    seconds = last["t"] - first["t"]
    gen, rew = last["generate"] - first["generate"], last["reward"] - first["reward"]
    return {"side": "trl", "setup_s": setup_s, "timed_steps": timed_steps, "step_s": seconds / timed_steps,
            "samples_per_s": batch * timed_steps / seconds,
            "generated_tokens_per_s": (last["tokens"] - first["tokens"]) / seconds,
            "share": {"generate": gen / seconds, "reward": rew / seconds, "rest": 1 - (gen + rew) / seconds}}


def side_shop_r1(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from shop_r1.config import load_config
    from shop_r1.data.encode import encode_prompts
    from shop_r1.distributed.runtime import start_ray
    from shop_r1.train import run_grpo

    model, examples, _ = _shared(args)
    tok = AutoTokenizer.from_pretrained(model)
    run = Path(args.tmp) / "shop_r1"
    cfg = load_config(None, [f"run_dir={run}", f"rl.steps={args.steps}", f"rollout.group_size={args.n}",
                             f"rl.global_batch_size={args.prompts * args.n}", f"rollout.max_new_tokens={args.max_new_tokens}",
                             f"rl.lr={LR}", f"rl.kl_beta={BETA}", f"rl.clip_eps={EPS}", "rollout.temperature=1.0",
                             "reward.rationale_reward=false", "logging.wandb=false", "logging.console_every=0",
                             f"rl.checkpoint_every={10**6}", f"model.max_context_tokens={args.max_prompt_tokens + args.max_new_tokens}",
                             "rollout.kv_cache_gib=2"])
    prompts = encode_prompts(tok, examples, args.max_prompt_tokens)
    runtime = start_ray(cfg.ray)
    try:
        t0 = time.perf_counter()
        result = run_grpo(cfg, model, prompts, run / "grpo", local=False, pad_id=tok.pad_token_id or 0)
        wall = time.perf_counter() - t0
    finally:
        runtime.shutdown()
    rows = [json.loads(x) for x in (run / "metrics_grpo.jsonl").read_text().splitlines()]
    timed = rows[1:] if len(rows) > 1 else rows
    seconds = sum(r["timing/step"] for r in timed)
    batch = args.prompts * args.n
    tokens = sum(r["rollout/response_tokens_mean"] * batch for r in timed)
    return {"side": "shop_r1", "setup_s": wall - sum(r["timing/step"] for r in rows),
            "timed_steps": len(timed), "step_s": seconds / len(timed), "samples_per_s": batch * len(timed) / seconds,
            "generated_tokens_per_s": tokens / seconds, "final_reward": result.last_reward,
            "share": {k: sum(r[f"timing/{k}"] for r in timed) / seconds
                      for k in ("rollout", "reward", "update", "weight_sync", "other")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny | smollm2 | a model folder")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (group size)")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps (the first is an untimed warm-up)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=1400)
    parser.add_argument("--side", choices=("trl", "shop_r1"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tmp", default="", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    if args.side is not None:
        emit((side_trl if args.side == "trl" else side_shop_r1)(args), args.json_out)
        return
    tmp = tempfile.mkdtemp(prefix="bench_trl_")
    common = [__file__, "--model", args.model, "--prompts", str(args.prompts), "--n", str(args.n), "--steps",
              str(args.steps), "--max-new-tokens", str(args.max_new_tokens), "--max-prompt-tokens",
              str(args.max_prompt_tokens), "--tmp", tmp]
    theirs = run_child([*common, "--side", "trl"], timeout_s=3600)
    ours = run_child([*common, "--side", "shop_r1"], timeout_s=3600)
    emit({"model": args.model, "prompts_per_step": args.prompts, "n": args.n, "steps": args.steps,
          "max_new_tokens": args.max_new_tokens, "max_prompt_tokens": args.max_prompt_tokens,
          "trl": theirs, "shop_r1": ours,
          "samples_per_s_ratio": ours["samples_per_s"] / theirs["samples_per_s"],
          "generated_tokens_per_s_ratio": ours["generated_tokens_per_s"] / theirs["generated_tokens_per_s"]},
         args.json_out)


if __name__ == "__main__":
    main()
