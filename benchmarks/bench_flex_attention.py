"""Shared-prompt attention in the learner's update: forward + backward time of one GRPO group (a P-token prompt, G
completions of C tokens) four ways, over prompt lengths and group sizes:

    unshared   the G rows as they are (each repeats the prompt): the model's own causal attention (SDPA, no 4D mask)
    dense      the prompt packed once with its completions (shop_r1/algo/shared_prompt.py), the [n, 1, W, W] mask
               through SDPA, which computes every (query, key) pair and masks it (learner.attention=dense)
    split      the same packs, each as two SDPA calls: its prompt causally, its completions against prompt +
               completions with a small mask, so no masked pair is computed (learner.attention=split; CPU and CUDA)
    flex       the same packs, the same mask as a FlexAttention BlockMask: blocks no query sees are skipped
               (learner.attention=flex; CUDA only, on CPU the column says so)

Each side runs the learner's forward math (`shop_r1.learner.forward.Forward.completion_logprobs`, the LM head on
completion tokens only) and the backward of a weighted logprob sum over micro-batches filled to
learner.max_tokens_per_micro_batch as the learner fills them (`grpo_step.micro_batches`); no optimizer step, so every
timed update sees the same weights. Sides alternate within each repeat (drift hits all alike), after one warm-up
each (which compiles flex). Completions have equal lengths, so the unshared rows carry no padding: its strongest case.
The model is built in code with random weights (`--shape`: qwen2.5-1.5b is Qwen2.5-1.5B's shape, 1.54B parameters;
smollm2 is SmolLM2-135M's shape and smollm2-6l its widths with 6 of its 30 layers, as a Qwen2, for CPU runs); bf16
on CUDA, float32 on CPU. Also reported: tokens and attention pairs each side computes, peak GPU memory, and from the
warm-up the largest |logprob| difference of split, flex and unshared from dense (bf16 rounding, not a correctness
test: that is tests/gpu/test_flex_shared_prompt_gpu.py in float32).

Run: python benchmarks/bench_flex_attention.py [--shape qwen2.5-1.5b|smollm2|smollm2-6l|tiny]
     [--prompt-lengths 512,1024,2048,4096] [--group-sizes 4,8,16] [--completion-tokens 256] [--repeats 3]
     [--max-tokens-per-micro-batch 8192] [--sides unshared,dense,split,flex] [--last-layer-at-targets off|on]
     [--time-budget-s 0] [--json-out PATH]
The JSON is rewritten after every (P, G), so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import emit, machine, spread  # noqa: E402

SHAPES = {  # (layers, hidden, intermediate, heads, kv heads, vocab)
    "tiny": (2, 64, 128, 2, 1, 512),
    "smollm2": (30, 576, 1536, 9, 3, 49152),  # SmolLM2-135M's shape
    "smollm2-6l": (6, 576, 1536, 9, 3, 49152),  # SmolLM2-135M's widths, 6 of its 30 layers
    "qwen2.5-1.5b": (28, 1536, 8960, 12, 2, 151936),  # Qwen2.5-1.5B's shape (tied embeddings)
}
SIDES = ("unshared", "dense", "split", "flex")


def build_model(shape: str, device: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    layers, hidden, inter, heads, kv, vocab = SHAPES[shape]
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=32768,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: a CPU init of 1.5B parameters takes longer than the run
        model = Qwen2ForCausalLM(cfg)
    return model.to(torch.bfloat16 if device == "cuda" else torch.float32)


def group_batch(prompt_tokens: int, group_size: int, completion_tokens: int, vocab: int, seed: int):
    """One group: a random prompt and `group_size` random completions of `completion_tokens` each, as GRPO rows."""
    import torch

    from shop_r1.algo.batch import GRPOBatch

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (prompt_tokens,), generator=g)
    ids = torch.cat([prompt.expand(group_size, -1), torch.randint(0, vocab, (group_size, completion_tokens),
                                                                  generator=g)], dim=1)
    comp = torch.zeros_like(ids)
    comp[:, prompt_tokens:] = 1
    adv = torch.randn(group_size, generator=g, dtype=torch.float64)
    return GRPOBatch(ids, torch.ones_like(ids), comp, torch.zeros_like(comp), adv, torch.zeros(ids.shape))


def micro_batches(batch, shared: bool, budget: int):
    """The learner's micro-batches for this batch (shop_r1.learner.grpo_step.micro_batches, one rank)."""
    from shop_r1.config import LearnerConfig
    from shop_r1.learner.grpo_step import micro_batches as learner_micro_batches

    backend = SimpleNamespace(cfg=LearnerConfig(shared_prompt=shared, max_tokens_per_micro_batch=budget),
                              all_reduce=lambda values, op="sum": values)
    return learner_micro_batches(backend, batch)


def computed_tokens(micro, shared: bool) -> int:
    """Positions the forwards compute: packed lines x width when shared, rows x width otherwise."""
    from shop_r1.algo.shared_prompt import pack_shared_prompts, prefix_lengths

    if not shared:
        return sum(mb.input_ids.numel() for mb in micro)
    return sum(pack_shared_prompts(mb.input_ids, mb.attention_mask,
                                   prefix_lengths(mb.completion_mask, mb.attention_mask)).num_positions for mb in micro)


def attention_pairs(micro, side: str) -> int:
    """(query, key) pairs each side's attention computes, per head and layer: unshared rows causally (T(T+1)/2 a row),
    dense every pair of its lines (W^2), split and flex the pairs the mask allows (p(p+1)/2 + C(p + C) a pack; flex
    in fact whole 128-blocks, a little more)."""
    from shop_r1.algo.shared_prompt import pack_shared_prompts, prefix_lengths
    from shop_r1.learner.split_attention import SplitLayout

    total = 0
    for mb in micro:
        if side == "unshared":
            total += sum(n * (n + 1) // 2 for n in mb.attention_mask.sum(dim=1).tolist())
            continue
        packed = pack_shared_prompts(mb.input_ids, mb.attention_mask, prefix_lengths(mb.completion_mask,
                                                                                     mb.attention_mask))
        if side == "dense":
            total += packed.num_positions * packed.segments.shape[1]
            continue
        for line in SplitLayout.of(packed, "cpu").lines:
            for p in line:
                c = p.end - p.start - p.prompt
                total += p.prompt * (p.prompt + 1) // 2 + c * (p.prompt + c)
    return total


def update(model, forward, micro, device: str):
    """Forward + backward of sum_b adv_b * mean_t logprob[b, t] over the micro-batches; (seconds, logprobs)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model.zero_grad(set_to_none=True)
    sync()
    start = time.perf_counter()
    out = []
    for mb in micro:
        logp = forward.completion_logprobs(model, mb)  # [b, T]
        mask = mb.completion_mask.to(device)
        adv = mb.advantages.to(device, logp.dtype)
        (-(adv[:, None] * logp * mask).sum() / mask.sum().clamp(min=1)).backward()
        out.append(logp.detach().float()[mask.bool()])
    sync()
    return time.perf_counter() - start, torch.cat(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    parser.add_argument("--prompt-lengths", default="512,1024,2048,4096")
    parser.add_argument("--group-sizes", default="4,8,16")
    parser.add_argument("--completion-tokens", type=int, default=256)
    parser.add_argument("--sides", default=",".join(SIDES), help="which of unshared,dense,split,flex to run")
    parser.add_argument("--last-layer-at-targets", choices=("off", "on"), default="off",
                        help="learner.last_layer_at_targets for every side (flex always runs the full forward)")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per side (after one warm-up each)")
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=8192)
    parser.add_argument("--time-budget-s", type=float, default=0.0,
                        help="start no new (P, G) after this many seconds (0: no limit)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    import torch

    from shop_r1.learner.forward import Forward

    began = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    model = build_model(args.shape, device)
    wanted = [s for s in args.sides.split(",") if s]
    if not wanted or set(wanted) - set(SIDES):
        parser.error(f"--sides: a comma list of {','.join(SIDES)}, got {args.sides!r}")
    sides = [s for s in SIDES if s in wanted and (device == "cuda" or s != "flex")]
    models = {"unshared": model, "dense": model}  # split and flex switch the attention of their own copies
    models.update({s: copy.deepcopy(model) for s in ("split", "flex") if s in sides})
    last = args.last_layer_at_targets == "on"
    forwards = {s: Forward(dev, s != "unshared", False, "dense" if s == "unshared" else s, last) for s in SIDES}
    grid = [(p, g) for p in map(int, args.prompt_lengths.split(",")) for g in map(int, args.group_sizes.split(","))]
    result = {"benchmark": "flex_attention", "machine": machine(), "device": device, "settings": vars(args),
              "parameters": sum(p.numel() for p in model.parameters()), "sides": list(sides),
              "skipped_sides": {} if device == "cuda" or "flex" not in wanted else
              {"flex": "learner.attention=flex needs CUDA"},
              "results": [], "unfinished": []}
    for prompt_tokens, group_size in grid:
        if args.time_budget_s and time.perf_counter() - began > args.time_budget_s:
            result["unfinished"].append({"prompt_tokens": prompt_tokens, "group_size": group_size})
            continue
        batch = group_batch(prompt_tokens, group_size, args.completion_tokens, model.config.vocab_size, args.seed)
        micro = {s: micro_batches(batch, s != "unshared", args.max_tokens_per_micro_batch) for s in sides}
        row = {"prompt_tokens": prompt_tokens, "group_size": group_size, "completion_tokens": args.completion_tokens,
               "real_tokens": int(batch.attention_mask.sum())}
        times, logprobs, peak, errors = {s: [] for s in sides}, {}, {}, {}
        for s in sides:  # warm-up (compiles flex on its first shapes)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            try:
                logprobs[s] = update(models[s], forwards[s], micro[s], device)[1]
            except torch.OutOfMemoryError as e:  # recorded in the results, not raised: the other sides still run
                errors[s] = f"OutOfMemoryError: {str(e)[:200]}"
            if device == "cuda":
                peak[s] = torch.cuda.max_memory_allocated() / 2**30
        for _ in range(args.repeats):
            for s in sides:
                if s not in errors:
                    times[s].append(update(models[s], forwards[s], micro[s], device)[0])
        for s in sides:
            row[s] = {"micro_batches": len(micro[s]), "computed_tokens": computed_tokens(micro[s], s != "unshared"),
                      "attention_pairs": attention_pairs(micro[s], s)}
            if s in errors:
                row[s]["error"] = errors[s]
                continue
            row[s]["update_s"] = spread(times[s])
            if device == "cuda":
                row[s]["peak_gib"] = round(peak[s], 2)
            if s != "dense" and "dense" in logprobs:
                row[s]["max_abs_logprob_diff_vs_dense"] = float((logprobs[s] - logprobs["dense"]).abs().max())
        median = {s: row[s]["update_s"]["median"] for s in sides if "update_s" in row[s]}
        for a, b in (("unshared", "dense"), ("unshared", "split"), ("unshared", "flex"), ("dense", "split"),
                     ("dense", "flex")):
            if a in median and b in median:
                row[f"{b}_speedup_over_{a}"] = round(median[a] / median[b], 3)
        result["results"].append(row)
        result["elapsed_s"] = round(time.perf_counter() - began, 1)
        print(f"P={prompt_tokens} G={group_size}: " + ", ".join(f"{s} {median[s]:.3f}s" for s in median), flush=True)
        if args.json_out:
            emit(result, args.json_out)
    emit(result, args.json_out)


if __name__ == "__main__":
    main()
