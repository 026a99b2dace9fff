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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_causal_mask import add_batch_arguments, model_and_batches, race, sft_forward_backward  # noqa: E402
from common import emit, machine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_arguments(parser)
    args = parser.parse_args()

    import torch

    from shop_r1.learner.forward import Forward

    model, mbs = model_and_batches(args)

    def step(targets_only: bool):
        return sft_forward_backward(model, mbs, Forward(torch.device("cpu"), last_layer_at_targets=targets_only))

    out = race(lambda: step(False), lambda: step(True), args.repeats)
    emit({"benchmark": "last_layer", "machine": machine(), "shape": args.shape, "rows": args.rows,
          "lengths": [args.len_min, args.len_max], "targets": args.targets,
          "micro_batches": [list(mb.input_ids.shape) for mb in mbs], "threads": torch.get_num_threads(),
          "full_s": out["old_s"], "targets_only_s": out["new_s"], "full_over_targets_only": out["ratio"],
          "max_abs_logprob_diff": out["max_abs_logprob_diff"], "max_rel_grad_diff": out["max_rel_grad_diff"]},
         args.json_out)


if __name__ == "__main__":
    main()
