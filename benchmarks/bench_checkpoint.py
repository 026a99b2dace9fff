"""What a checkpoint costs: the time of one resumable checkpoint (`shop_r1.checkpoint.save` of a DeepSpeed learner:
weights, AdamW state, schedule, then fsync and the atomic rename) and its size, so that a checkpoint cadence can be
chosen knowing both sides of the trade: checkpointing every k steps costs save_s / (k * step_s) of the run, and a
crash loses at most k * step_s of work.

The learner runs in this process (no Ray: the save is the learner writing its own files either way), after one
training step so that the optimizer state exists. Reported per model: median and spread of `--repeats` saves, bytes
on disk, and for each cadence in `--every` the overhead share and the worst-case loss given `--step-s` (the measured
GRPO step time of that model on the machine, e.g. from a run's timing/step).

Run: python benchmarks/bench_checkpoint.py [--model tiny|smollm2|DIR] [--repeats 5] [--step-s 1.4]
     [--every 10 50] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, model_dir  # noqa: E402


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--step-s", type=float, required=True, help="the model's measured GRPO step time (s)")
    parser.add_argument("--every", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    from shop_r1 import checkpoint
    from shop_r1.config import LearnerConfig
    from shop_r1.learner.rank import LearnerRank
    from shop_r1.learner.sft_data import MicroBatch

    with tempfile.TemporaryDirectory() as tmp:
        model = model_dir(args.model, Path(tmp))
        learner = LearnerRank(model, LearnerConfig(zero_stage=0), lr=1e-5, total_steps=10)
        ids = torch.randint(0, 100, (1, 64))
        learner.sft_step([MicroBatch(ids, torch.ones_like(ids), torch.ones_like(ids), 64)], 64)  # optimizer state
        root, times = Path(tmp) / "checkpoints", []
        for i in range(args.repeats):
            state = checkpoint.TrainState(i + 1, 0, i, checkpoint.capture_rng())
            start = time.perf_counter()
            saved = checkpoint.save(root, state, {}, lambda d, i=i: learner.save_checkpoint(d, {"step": i + 1}))
            times.append(time.perf_counter() - start)
            size = _folder_bytes(saved)
            checkpoint.prune(root, 1)
    save_s = statistics.median(times)
    emit({"benchmark": "checkpoint", "model": args.model, "repeats": args.repeats, "save_s_median": save_s,
          "save_s_min": min(times), "save_s_max": max(times), "bytes": size, "step_s": args.step_s,
          "cadence": [{"every": k, "overhead_share": save_s / (k * args.step_s), "worst_loss_s": k * args.step_s}
                      for k in args.every]}, args.json_out)


if __name__ == "__main__":
    main()
