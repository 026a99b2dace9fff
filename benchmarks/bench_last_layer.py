"""The last decoder layer at the targets only (learner.last_layer_at_targets, shop_r1/learner/target_states.py) vs
the full forward: the forward + backward of SFT micro-batches shaped as the main job's.

Both sides run `Forward.target_logprobs` and backward on the same right-padded micro-batches in this process (plain
torch, no DeepSpeed, no optimizer update), alternating; the full side is today's path (every layer over every
position, SDPA `is_causal`). Reported: step time per side (median and spread), the ratio full / targets-only per
repeat, and the largest difference of the target logprobs and of the gradients between the two.

Rows as benchmarks/bench_causal_mask.py makes them (`--rows` sequences of uniform random length in [--len-min,
--len-max], `--targets` target tokens at each row's end). The model: the main job's from-scratch shape (Qwen2,
hidden 128, 2 layers) or SmolLM2-135M's (`--shape smollm2`, 30 layers: the saving is at most 1/30), random weights.

Run: python benchmarks/bench_last_layer.py [--shape shop|smollm2] [--rows 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_causal_mask import SHAPE_NAMES, micro_batches  # noqa: E402
from bench_packing import build_model  # noqa: E402
from common import emit, machine, spread  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=SHAPE_NAMES, default="shop")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--len-min", type=int, default=600)
    parser.add_argument("--len-max", type=int, default=1850)
    parser.add_argument("--targets", type=int, default=70)
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per side (after one warm-up each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    import torch

    from shop_r1.learner.forward import Forward

    model = build_model(args.shape, "sdpa", "cpu")
    mbs = micro_batches(args, model.config.vocab_size)

    def step(targets_only: bool) -> tuple[float, list[torch.Tensor], list[torch.Tensor]]:
        fw = Forward(torch.device("cpu"), last_layer_at_targets=targets_only)
        model.zero_grad(set_to_none=True)
        n = sum(mb.num_loss_tokens for mb in mbs)
        start, outs = time.perf_counter(), []
        for mb in mbs:
            logp = fw.target_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask)
            (-logp.sum() / n).backward()
            outs.append(logp.detach())
        seconds = time.perf_counter() - start
        return seconds, outs, [p.grad.detach().clone() for p in model.parameters()]

    step(False), step(True)  # warm-up
    full_s, fast_s, ratios, logp_diff, grad_diff = [], [], [], 0.0, 0.0
    for _ in range(args.repeats):
        t_full, out_full, g_full = step(False)
        t_fast, out_fast, g_fast = step(True)
        full_s.append(t_full), fast_s.append(t_fast), ratios.append(t_full / t_fast)
        logp_diff = max(logp_diff, max(float((a - b).abs().max()) for a, b in zip(out_full, out_fast)))
        grad_diff = max(grad_diff, max(float((a - b).abs().max() / (a.abs().max() + 1e-30))
                                       for a, b in zip(g_full, g_fast)))
    emit({"benchmark": "last_layer", "machine": machine(), "shape": args.shape, "rows": args.rows,
          "lengths": [args.len_min, args.len_max], "targets": args.targets,
          "micro_batches": [list(mb.input_ids.shape) for mb in mbs], "threads": torch.get_num_threads(),
          "full_s": spread(full_s), "targets_only_s": spread(fast_s), "full_over_targets_only": spread(ratios),
          "max_abs_logprob_diff": logp_diff, "max_rel_grad_diff": grad_diff}, args.json_out)


if __name__ == "__main__":
    main()
