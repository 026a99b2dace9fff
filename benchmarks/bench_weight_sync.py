"""Weight sync and step-time shares, from one GRPO run on the real stack (Ray, vLLM engine, DeepSpeed learner).

Prints, side by side in the same run:
- weight-sync seconds and GB/s against a raw broadcast of the same number of bytes on a process group of the same
  shape (gloo here, NCCL on GPUs), i.e. what the bucketing, the ZeRO gather and the engine-side reload cost on top
  of moving the bytes;
- the share of GRPO step time spent outside generate / score / update / sync (driver overhead).

Run: python benchmarks/bench_weight_sync.py [--model DIR] [--steps 4] [--weight-load auto|in_place|layerwise]
         [--bucket-mb N] [--zero-copy on|off] [--set KEY=VALUE ...]
(default: the tiny test model; rollout.weight_load: how the engine loads, in place or through vLLM's layerwise reload;
--bucket-mb: rl.weight_sync_bucket_mb, the broadcast's bucket size; --zero-copy: weight_sync.zero_copy, a broadcast
per tensor from the learner's parameters instead of packed buckets; --set: any other dotted config override, e.g.
rollout.num_cpus_per_engine=2 learner.num_cpus_per_rank=2, the main job's placement: both processes get two
OpenMP threads and take turns in the synchronous loop, the engine's repack overlapping the learner's packing)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, model_dir  # noqa: E402


def raw_broadcast_seconds(num_bytes: int, repeats: int = 3) -> float:
    """Broadcast `num_bytes` from rank 0 to rank 1 over a fresh gloo group between two Ray actors."""
    import ray
    import torch

    from shop_r1.weight_sync.broadcast import SyncGroupSpec, _process_group

    @ray.remote(num_cpus=0)
    class Peer:
        def __init__(self, spec: SyncGroupSpec, rank: int) -> None:
            self.rank = rank
            self.store, self.pg = _process_group(spec, rank)
            self.buf = torch.zeros(num_bytes // 4, dtype=torch.float32)

        def run(self, repeats: int) -> float:
            self.pg.broadcast(self.buf, 0).wait()  # warm-up
            start = time.perf_counter()
            for _ in range(repeats):
                self.pg.broadcast(self.buf, 0).wait()
            return (time.perf_counter() - start) / repeats

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = SyncGroupSpec("127.0.0.1", port, 2)
    peers = [Peer.remote(spec, r) for r in range(2)]
    return max(ray.get([p.run.remote(repeats) for p in peers]))


def _first_bucket_mb(bucket_mb: int) -> float | None:
    """The learners' first bucket in this code (None where the code has no small first bucket)."""
    try:
        from shop_r1.weight_sync.broadcast import first_bucket_bytes
    except ImportError:
        return None
    return first_bucket_bytes(bucket_mb << 20) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--weight-load", default="auto", choices=("auto", "in_place", "layerwise"),
                        help="rollout.weight_load")
    parser.add_argument("--bucket-mb", type=int, default=0, help="rl.weight_sync_bucket_mb (0: the config's)")
    parser.add_argument("--zero-copy", choices=("on", "off"), default="off", help="weight_sync.zero_copy")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="more dotted config overrides (after the benchmark's own; may be repeated)")
    parser.add_argument("--json-out", default="", help="also write the result JSON here")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from shop_r1.config import load_config
    from shop_r1.data.encode import encode_prompts
    from shop_r1.data.examples import build_rl_examples, chat_token_counter
    from shop_r1.data.synth import synthesize_sessions
    from shop_r1.distributed.runtime import start_ray
    from shop_r1.train import run_grpo

    tmp = Path(tempfile.mkdtemp(prefix="bench_sync_"))
    args.model = model_dir(args.model or "tiny", tmp)
    tok = AutoTokenizer.from_pretrained(args.model)
    examples = build_rl_examples(synthesize_sessions(8, 0), "whole_session", 1000, chat_token_counter(tok)).examples
    prompts = encode_prompts(tok, examples, 1000)
    cfg = load_config(None, [f"run_dir={tmp}", f"rl.steps={args.steps}", "rollout.group_size=4",
                             "rl.global_batch_size=8", "rollout.max_new_tokens=32", "logging.wandb=false",
                             "logging.console_every=0", "rl.checkpoint_every=1000",
                             f"rollout.weight_load={args.weight_load}",
                             f"weight_sync.zero_copy={'true' if args.zero_copy == 'on' else 'false'}",
                             *([f"rl.weight_sync_bucket_mb={args.bucket_mb}"] if args.bucket_mb else []), *args.set])
    runtime = start_ray(cfg.ray)
    try:
        run_grpo(cfg, args.model, prompts, tmp / "grpo", local=False, pad_id=tok.pad_token_id or 0)
        rows = [json.loads(x) for x in (tmp / "metrics_grpo.jsonl").read_text().splitlines()][1:]  # skip warm-up
        num_bytes = int(rows[0]["weight_sync/bytes"])
        raw = raw_broadcast_seconds(num_bytes)
    finally:
        runtime.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)  # the run's model, checkpoints and data (GBs for SmolLM2)
    sync = sum(r["timing/weight_sync"] for r in rows) / len(rows)
    step = sum(r["timing/step"] for r in rows) / len(rows)
    other = sum(r["timing/other"] for r in rows) / len(rows)
    result = {
        "model": args.model, "steps_measured": len(rows), "weight_bytes": num_bytes,
        "first_bucket_mb": _first_bucket_mb(cfg.rl.weight_sync_bucket_mb),
        "weight_load": cfg.rollout.weight_load, "bucket_mb": cfg.rl.weight_sync_bucket_mb,
        "zero_copy": cfg.weight_sync.zero_copy, "overrides": list(args.set),
        "num_cpus_per_engine": cfg.rollout.num_cpus_per_engine, "num_cpus_per_rank": cfg.learner.num_cpus_per_rank,
        "threads": {k: rows[0][f"threads/{k}"] for k in ("engine_min", "learner_min") if f"threads/{k}" in rows[0]},
        "syncs_in_place": sum(r.get("weight_sync/in_place", 0.0) for r in rows),
        "weight_sync_s_per_step": [r["timing/weight_sync"] for r in rows],
        "weight_sync_s": sync, "weight_sync_gb_per_s": num_bytes / sync / 1e9,
        "raw_broadcast_s": raw, "raw_broadcast_gb_per_s": num_bytes / raw / 1e9, "sync_over_raw": sync / raw,
        # Per-phase means (shop_r1.distributed.protocols.SyncStats), where the driver logs them.
        "weight_sync_phase_s": {k: sum(r[f"timing/weight_sync_{k}"] for r in rows) / len(rows)
                                for k in ("pack", "transfer", "load", "post", "reset")
                                if all(f"timing/weight_sync_{k}" in r for r in rows)},
        "cpu_linear": cfg.rollout.cpu_linear,
        "rollout_s_per_step": [r["timing/rollout"] for r in rows],
        "step_s": step, "share_outside_stages": other / step,
        "share_by_stage": {k: sum(r[f"timing/{k}"] for r in rows) / len(rows) / step
                           for k in ("rollout", "reward", "advantages", "update", "weight_sync", "other")},
    }
    emit(result, args.json_out)


if __name__ == "__main__":
    main()
