"""Right-padded learner rows under the model's own causal mask vs the padding mask: the forward + backward of SFT
micro-batches shaped as the main job's (shop_r1/learner/forward.py `right_padded`).

transformers turns a padding mask into a dense 4D mask for SDPA; for right-padded rows the causal mask alone gives
the real positions the same outputs, and SDPA then runs `is_causal`, skipping the blocks above the diagonal. Both
sides run `Forward.target_logprobs` and backward on the same micro-batches in this process (plain torch, no
DeepSpeed, no optimizer update), alternating; the old side passes the padding mask as a left-padded-looking row
would force it to. Reported: step time per side (median and spread), the ratio old / new per repeat, and the largest
difference of the target logprobs and of the gradients between the two.

Rows: `--rows` sequences of uniform random length in [--len-min, --len-max] (the main job's SFT: 600-1850 tokens,
~70 target tokens at each row's end), right-padded and split by `--max-tokens-per-micro-batch` as
`shop_r1.learner.sft_data.pack_micro_batches` does. The model: the main job's from-scratch shape (Qwen2, hidden 128,
2 layers, 4 heads of 32, 2 KV heads, vocab 1,846) or SmolLM2-135M's (`--shape smollm2`), random weights.

Run: python benchmarks/bench_causal_mask.py [--shape shop|smollm2] [--rows 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_packing import build_model  # noqa: E402
from common import emit, machine, spread  # noqa: E402

SHAPE_NAMES = ("shop", "smollm2")  # bench_packing.SHAPES: the main job's from-scratch model, SmolLM2-135M


def micro_batches(args: argparse.Namespace, vocab: int):
    import torch

    from shop_r1.learner.sft_data import SFTSequence, pack_micro_batches

    g = torch.Generator().manual_seed(args.seed)
    seqs = []
    for k in range(args.rows):
        n = int(torch.randint(args.len_min, args.len_max + 1, (1,), generator=g))
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        mask = [0] * (n - args.targets) + [1] * args.targets
        seqs.append(SFTSequence(f"row{k}", tuple(ids), tuple(mask)))
    return pack_micro_batches(seqs, args.max_tokens_per_micro_batch)


def add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    """The micro-batch and repeat options both SFT-forward benchmarks take (this one and bench_last_layer.py)."""
    parser.add_argument("--shape", choices=SHAPE_NAMES, default="shop")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--len-min", type=int, default=600)
    parser.add_argument("--len-max", type=int, default=1850)
    parser.add_argument("--targets", type=int, default=70)
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per side (after one warm-up each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None)


def race(old, new, repeats: int) -> dict:
    """`old` and `new` (each () -> (seconds, logprobs per micro-batch, gradients)) after one warm-up each, then
    alternating: per-side times, the old / new ratio per repeat, and the largest logprob and relative gradient
    differences between the two."""
    old(), new()  # warm-up
    old_s, new_s, ratios, logp_diff, grad_diff = [], [], [], 0.0, 0.0
    for _ in range(repeats):
        t_old, out_old, g_old = old()
        t_new, out_new, g_new = new()
        old_s.append(t_old), new_s.append(t_new), ratios.append(t_old / t_new)
        logp_diff = max(logp_diff, max(float((a - b).abs().max()) for a, b in zip(out_old, out_new)))
        grad_diff = max(grad_diff, max(float((a - b).abs().max() / (a.abs().max() + 1e-30))
                                       for a, b in zip(g_old, g_new)))
    return {"old_s": spread(old_s), "new_s": spread(new_s), "ratio": spread(ratios),
            "max_abs_logprob_diff": logp_diff, "max_rel_grad_diff": grad_diff}


def model_and_batches(args: argparse.Namespace):
    """The benchmark's model (`--shape`, random weights, SDPA) and its micro-batches."""
    model = build_model(args.shape, "sdpa", "cpu")
    return model, micro_batches(args, model.config.vocab_size)


def sft_forward_backward(model, mbs, fw) -> tuple[float, list, list]:
    """One SFT step's forward + backward of `mbs` through `fw` (a Forward): its seconds, the target logprobs per
    micro-batch, and the gradients."""
    model.zero_grad(set_to_none=True)
    n = sum(mb.num_loss_tokens for mb in mbs)
    start, outs = time.perf_counter(), []
    for mb in mbs:
        logp = fw.target_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask)
        (-logp.sum() / n).backward()
        outs.append(logp.detach())
    seconds = time.perf_counter() - start
    return seconds, outs, [p.grad.detach().clone() for p in model.parameters()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_arguments(parser)
    args = parser.parse_args()

    import torch

    import shop_r1.learner.forward as forward_mod
    from shop_r1.learner.forward import Forward

    model, mbs = model_and_batches(args)
    fw = Forward(torch.device("cpu"))
    real = forward_mod.right_padded

    def step(causal: bool) -> tuple[float, list[torch.Tensor], list[torch.Tensor]]:
        forward_mod.right_padded = real if causal else (lambda mask: False)  # the old side: always the padding mask
        try:
            return sft_forward_backward(model, mbs, fw)
        finally:
            forward_mod.right_padded = real

    out = race(lambda: step(False), lambda: step(True), args.repeats)
    emit({"benchmark": "causal_mask", "machine": machine(), "shape": args.shape, "rows": args.rows,
          "lengths": [args.len_min, args.len_max], "micro_batches": [list(mb.input_ids.shape) for mb in mbs],
          "threads": torch.get_num_threads(), "padding_mask_s": out["old_s"], "causal_s": out["new_s"],
          "padding_over_causal": out["ratio"], "max_abs_logprob_diff": out["max_abs_logprob_diff"],
          "max_rel_grad_diff": out["max_rel_grad_diff"]}, args.json_out)


if __name__ == "__main__":
    main()
