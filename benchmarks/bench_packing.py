"""Sequence packing in the learner: the GRPO update's forward + backward with micro-batches padded to their longest
row vs packed end to end (shop_r1/algo/packing.py), on groups whose prompts are uneven (200-2000 tokens).

Both sides run the real step (`shop_r1.learner.grpo_step.grpo_update`: micro-batches by the same token budget, the
policy's forward, the GRPO loss, backward) on a plain-torch backend in this process (no DeepSpeed, no Ray, no
optimizer update, so every timed step sees the same weights), alternating padded and packed steps on the same
batch. The model is built in code with random weights (no tokenizer needed: token ids are random). Reported per
side: step time (median and spread), the positions the forwards computed (lines x width, summed over
micro-batches) against the real tokens, and the ratio padded / packed.

Run: python benchmarks/bench_packing.py [--shape tiny|smollm2|qwen2-0.5b] [--groups 8] [--group-size 4]
     [--prompt-min 200] [--prompt-max 2000] [--completion-max 128] [--steps 3] [--shared-prompt on|off]
     [--attn sdpa|eager] [--max-tokens-per-micro-batch 8192]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, machine, spread  # noqa: E402

SHAPES = {  # (layers, hidden, intermediate, heads, kv heads, vocab)
    "tiny": (2, 64, 128, 4, 2, 512),
    "shop": (2, 128, 384, 4, 2, 1846),  # configs/demo_cpu.yaml's from-scratch model (bench_causal_mask.py)
    "smollm2": (30, 576, 1536, 9, 3, 49152),  # SmolLM2-135M's shape (Llama)
    "qwen2-0.5b": (24, 896, 4864, 14, 2, 151936),  # Qwen2.5-0.5B's shape
}


def build_model(shape: str, attn: str, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    layers, hidden, inter, heads, kv, vocab = SHAPES[shape]
    kwargs = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=8192,
                  attn_implementation=attn)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**kwargs)) if shape == "smollm2" else Qwen2ForCausalLM(Qwen2Config(**kwargs))
    return model.to(device, torch.bfloat16 if device == "cuda" else torch.float32)


def make_batch(args: argparse.Namespace, vocab: int):
    """`groups` prompts of uniform random length in [prompt_min, prompt_max], each with `group_size` completions of
    1..completion_max tokens; rows right-padded (shop_r1.algo.batch layout)."""
    import torch

    from shop_r1.algo.batch import GRPOBatch

    g = torch.Generator().manual_seed(args.seed)
    rows = []
    for _ in range(args.groups):
        prompt = torch.randint(0, vocab, (int(torch.randint(args.prompt_min, args.prompt_max + 1, (1,),
                                                            generator=g)),), generator=g).tolist()
        for _ in range(args.group_size):
            n = int(torch.randint(1, args.completion_max + 1, (1,), generator=g))
            rows.append((prompt, torch.randint(0, vocab, (n,), generator=g).tolist()))
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn, comp = torch.zeros_like(ids), torch.zeros_like(ids)
    for b, (p, c) in enumerate(rows):
        ids[b, :len(p) + len(c)] = torch.tensor(p + c)
        attn[b, :len(p) + len(c)] = 1
        comp[b, len(p):len(p) + len(c)] = 1
    return GRPOBatch(ids, attn, comp, torch.zeros_like(comp), torch.randn(len(rows), generator=g, dtype=torch.float64),
                     torch.zeros(ids.shape))


class PlainBackend:
    """The TrainingRank protocol in plain torch, one rank: backward accumulates, the optimizer step only clears the
    gradient (the weights stay fixed, so every timed step does the same work)."""

    def __init__(self, model, cfg):
        import torch

        self.policy, self.cfg, self.reference, self.rank, self.world_size = model, cfg, None, 0, 1
        self.device = next(model.parameters()).device
        self._torch = torch

    def begin_micro_batch(self) -> None:
        pass

    def backward(self, loss) -> None:
        loss.backward()

    def optimizer_step(self, losses: Sequence[float]):
        from shop_r1.learner.backend import OptimizerStep

        self.policy.zero_grad(set_to_none=True)
        return OptimizerStep(0.0)

    def all_reduce(self, values, op: str = "sum"):
        return values


def positions(backend: PlainBackend, batch, pack: bool) -> int:
    """Positions the policy forwards compute for this batch (lines x width, summed over micro-batches)."""
    from shop_r1.algo.shared_prompt import pack_rows, pack_shared_prompts, prefix_lengths
    from shop_r1.learner.grpo_step import micro_batches

    total = 0
    for mb in micro_batches(backend, batch, pack):
        if backend.cfg.shared_prompt:
            total += pack_shared_prompts(mb.input_ids, mb.attention_mask,
                                         prefix_lengths(mb.completion_mask, mb.attention_mask), pack).num_positions
        else:
            total += min(pack_rows(mb.input_ids, mb.attention_mask).num_positions if pack else mb.input_ids.numel(),
                         mb.input_ids.numel())  # unpacked when packing saves nothing (Forward)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt-min", type=int, default=200)
    parser.add_argument("--prompt-max", type=int, default=2000)
    parser.add_argument("--completion-max", type=int, default=128)
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=8192)
    parser.add_argument("--shared-prompt", choices=["on", "off"], default="off")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side (after one warm-up each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    import torch

    from shop_r1.config import LearnerConfig, RLConfig
    from shop_r1.learner.grpo_step import grpo_update

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(args.shape, args.attn, device)
    batch = make_batch(args, model.config.vocab_size)
    cfg = LearnerConfig(max_tokens_per_micro_batch=args.max_tokens_per_micro_batch,
                        shared_prompt=args.shared_prompt == "on")
    backend = PlainBackend(model, cfg)
    loss_cfg = RLConfig(kl_beta=0.0).loss_config(args.completion_max)

    def step(pack: bool) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        grpo_update(backend, batch, loss_cfg, step=1, pack=pack)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    step(False), step(True)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.steps):  # alternate, so drift on a shared machine hits both sides alike
        for pack in (False, True):
            times[pack].append(step(pack))
    padded, packed = spread(times[False]), spread(times[True])
    emit({
        "benchmark": "packing", "machine": machine(), "device": device, "settings": vars(args),
        "rows": batch.num_responses, "real_tokens": int(batch.attention_mask.sum()),
        "padded": {"step_s": padded, "positions": positions(backend, batch, False)},
        "packed": {"step_s": packed, "positions": positions(backend, batch, True)},
        "speedup_packed_over_padded": padded["median"] / packed["median"],
    }, args.json_out)


if __name__ == "__main__":
    main()
