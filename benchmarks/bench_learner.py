"""Learner throughput: the learner group (DeepSpeed ranks as Ray actors, with the frozen reference) against a bare
DeepSpeed loop on the same GRPO batches.

The bare loop is what one would write by hand in a single process: `deepspeed.initialize` with the same config and
optimizer, the reference forward, a full-vocabulary log-softmax, the same GRPO loss (`shop_r1.algo.grpo_loss`),
`backward`, `step`. The learner group adds the Ray hop (the batch is pickled to the actor), token-budget
micro-batching, and computes the LM head only at completion positions. Both run the same number of warm-up and
timed steps on identical batches; reported: training tokens/s (prompt + completion tokens through forward and
backward) for each, and the ratio group/bare.

With `--group-size G > 1` the rows come in groups of G sharing one prompt (as GRPO's do), and the learner group
also runs with `learner.shared_prompt=false`: `ratio_shared_over_unshared` is what encoding each prompt once buys.

With `--no-ray` the learner is called in process (no Ray hop), as on a machine without Ray; on CUDA both sides run
bf16 and the timer waits for the device.

Run: python benchmarks/bench_learner.py [--model tiny|smollm2|smollm2-shaped|DIR] [--batch 8] [--prompt-tokens 512]
     [--completion-tokens 64] [--steps 3] [--group-size 1] [--no-ray]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, model_dir, run_child  # noqa: E402


def make_batch(args: argparse.Namespace, vocab: int, seed: int):
    import torch

    from shop_r1.algo.batch import GRPOBatch

    g = torch.Generator().manual_seed(seed)
    t = args.prompt_tokens + args.completion_tokens
    ids = torch.randint(0, vocab, (args.batch, t), generator=g)
    for start in range(0, args.batch, args.group_size):  # a group's rows share the first row's prompt
        ids[start:start + args.group_size, :args.prompt_tokens] = ids[start, :args.prompt_tokens].clone()
    completion = torch.zeros(args.batch, t, dtype=torch.long)
    completion[:, args.prompt_tokens:] = 1
    return GRPOBatch(ids, torch.ones(args.batch, t, dtype=torch.long), completion, torch.zeros_like(completion),
                     torch.randn(args.batch, generator=g), torch.zeros(args.batch, t))


def _vocab(model: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(model))


def bare(args: argparse.Namespace) -> dict:
    """Child process: the hand-written DeepSpeed GRPO loop."""
    import torch

    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    import deepspeed
    from transformers import AutoModelForCausalLM

    from shop_r1.algo.grpo_loss import LossInputs, grpo_loss
    from shop_r1.config import LearnerConfig, RLConfig
    from shop_r1.learner.deepspeed_learner import deepspeed_config, init_deepspeed_comm
    from shop_r1.learner.process_group import init_process_group

    gpu = torch.cuda.is_available()
    store = init_process_group(0, 1, "nccl" if gpu else "gloo")  # noqa: F841 - the group's store must stay alive
    init_deepspeed_comm(gpu)
    cfg, rl = LearnerConfig(zero_stage=args.zero_stage), RLConfig()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-6),
                                      config=deepspeed_config(cfg, bf16=gpu))
    ref = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if gpu else torch.float32)
    ref = ref.to(engine.device).eval().requires_grad_(False)

    def logprobs(m, ids, mask):
        logits = m(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return torch.nn.functional.pad(lp, (1, 0))

    def step(batch) -> None:
        ids, mask = batch.input_ids.to(engine.device), batch.attention_mask.to(engine.device)
        comp = batch.completion_mask.to(engine.device)
        with torch.no_grad():
            ref_lp = logprobs(ref, ids, mask)
        lp = logprobs(engine.module, ids, mask)
        out = grpo_loss(LossInputs(lp, lp.detach(), batch.advantages.to(engine.device), comp, ref_logp=ref_lp),
                        rl.loss_config(args.completion_tokens))
        engine.backward(out.loss)
        engine.step()

    return _timed(args, step)


def group(args: argparse.Namespace) -> dict:
    """Child process: the learner group through Ray, as train.py drives it."""
    from shop_r1.config import LearnerConfig, RayConfig, RLConfig
    from shop_r1.distributed.learner_group import LearnerGroup
    from shop_r1.distributed.runtime import start_ray

    runtime = start_ray(RayConfig())
    try:
        cfg = LearnerConfig(zero_stage=args.zero_stage, num_cpus_per_rank=os.cpu_count() or 1,
                            max_tokens_per_micro_batch=args.batch * (args.prompt_tokens + args.completion_tokens),
                            shared_prompt=args.shared_prompt == "on")
        learners = LearnerGroup(args.model, cfg, 1e-6, 100, 0, local=False, reference_path=args.model)
        rl = RLConfig()
        loss_cfg = rl.loss_config(args.completion_tokens)
        result = _timed(args, lambda batch: learners.grpo_step(batch, loss_cfg), sync=False)  # the Ray call waits
        learners.shutdown()
    finally:
        runtime.shutdown()
    return result


def in_process(args: argparse.Namespace) -> dict:
    """Child process: the learner (LearnerRank, learner.backend=deepspeed) called directly, without Ray: what the
    group runs in each rank's actor, for machines without Ray (the GPU machine) or to separate the Ray hop."""
    from shop_r1.config import LearnerConfig, RLConfig
    from shop_r1.learner.rank import LearnerRank

    cfg = LearnerConfig(zero_stage=args.zero_stage,
                        max_tokens_per_micro_batch=args.batch * (args.prompt_tokens + args.completion_tokens),
                        shared_prompt=args.shared_prompt == "on")
    learner = LearnerRank(args.model, cfg, 1e-6, 100, reference_path=args.model)
    rl = RLConfig()
    return _timed(args, lambda batch: learner.grpo_step(batch, rl.loss_config(args.completion_tokens)))


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(args: argparse.Namespace, step, sync: bool = True) -> dict:
    """`sync`: wait for the device before reading the clock (in-process sides; the driver of the Ray group must not
    open a CUDA context of its own next to learner rank 0)."""
    vocab = _vocab(args.model)
    batches = [make_batch(args, vocab, seed) for seed in range(args.warmup + args.steps)]
    for b in batches[:args.warmup]:
        step(b)
    if sync:
        _sync()
    start = time.perf_counter()
    for b in batches[args.warmup:]:
        step(b)
    if sync:
        _sync()
    seconds = time.perf_counter() - start
    tokens = args.steps * args.batch * (args.prompt_tokens + args.completion_tokens)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=8, help="responses per GRPO step")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--zero-stage", type=int, default=0)
    parser.add_argument("--group-size", type=int, default=1, help="rows per shared prompt")
    parser.add_argument("--shared-prompt", choices=("on", "off"), default="on", help=argparse.SUPPRESS)
    parser.add_argument("--no-ray", action="store_true",
                        help="time the learner called in process (no Ray) against the bare loop")
    parser.add_argument("--side", choices=("bare", "group", "in_process"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    if args.side is not None:
        emit({"bare": bare, "group": group, "in_process": in_process}[args.side](args), args.json_out)
        return
    args.model = model_dir(args.model, Path(tempfile.mkdtemp(prefix="bench_learner_")))
    common = [__file__, "--model", args.model, "--batch", str(args.batch), "--prompt-tokens", str(args.prompt_tokens),
              "--completion-tokens", str(args.completion_tokens), "--steps", str(args.steps), "--warmup",
              str(args.warmup), "--zero-stage", str(args.zero_stage), "--group-size", str(args.group_size)]
    side = "in_process" if args.no_ray else "group"
    b = run_child([*common, "--side", "bare"], timeout_s=3600)
    g = run_child([*common, "--side", side], timeout_s=3600)
    out = {"model": args.model, "batch": args.batch, "prompt_tokens": args.prompt_tokens,
           "completion_tokens": args.completion_tokens, "steps": args.steps, "zero_stage": args.zero_stage,
           "group_size": args.group_size, "learner_side": side, "bare_tokens_per_s": b["tokens_per_s"],
           "group_tokens_per_s": g["tokens_per_s"], "ratio_group_over_bare": g["tokens_per_s"] / b["tokens_per_s"]}
    if args.group_size > 1:
        u = run_child([*common, "--side", side, "--shared-prompt", "off"], timeout_s=3600)
        out.update(group_unshared_tokens_per_s=u["tokens_per_s"],
                   ratio_shared_over_unshared=g["tokens_per_s"] / u["tokens_per_s"])
    emit(out, args.json_out)


if __name__ == "__main__":
    main()
