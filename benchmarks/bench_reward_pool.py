"""Reward pool throughput: responses/s through the pool of reward actors, per actor, and its scaling from 1 to N
actors, against scoring in the driver's own process.

The responses are Shop-R1-shaped: a JSON object with a first-person rationale and an action (clicks, searches,
terminates; a tenth unparseable), each with per-token top-20 logprobs for the self-certainty term, scored against
targets with long names so ROUGE-L does real work. Every pool size scores the same responses, in the same run.

Run: python benchmarks/bench_reward_pool.py [--responses 4000] [--actors 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit  # noqa: E402

WORDS = ("organic", "cotton", "crew", "neck", "t-shirt", "men's", "pack", "of", "3", "wireless", "earbuds", "noise",
         "cancelling", "stainless", "steel", "water", "bottle", "32", "oz", "insulated", "add", "to", "cart", "buy",
         "now", "search", "results", "filter", "price", "low", "high")


def make_requests(n: int, seed: int = 0) -> list:
    from shop_r1.types import Action, ScoreRequest, TokenLogprobs

    rng = random.Random(seed)

    def phrase(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    out = []
    for i in range(n):
        kind = ("click", "type_and_submit", "terminate")[i % 3]
        name = phrase(rng.randint(3, 10))
        target = Action(kind, name=name if kind != "terminate" else "",
                        text=phrase(3) if kind == "type_and_submit" else "")
        guess = dict(target.to_dict())
        if "name" in guess and rng.random() < 0.5:
            guess["name"] = phrase(rng.randint(3, 10))
        rationale = "I want " + phrase(rng.randint(10, 30)) + ", so I will do this next."
        text = json.dumps({"rationale": rationale, "action": guess}) if i % 10 else "{not json " + phrase(5)
        num_tokens = max(1, len(text) // 4)
        offsets = tuple(min(4 * j, len(text)) for j in range(num_tokens))
        topk = tuple(tuple(sorted((math.log(rng.random() + 1e-9) - 2 for _ in range(20)), reverse=True))
                     for _ in range(num_tokens))
        out.append(ScoreRequest(text, target, TokenLogprobs(offsets, topk, 49152)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=4000)
    parser.add_argument("--actors", default="1,2,4")
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()

    from shop_r1.config import RayConfig, RewardConfig, RewardPoolConfig
    from shop_r1.distributed.reward_pool import RewardPool
    from shop_r1.distributed.runtime import start_ray
    from shop_r1.reward.scorer import score_response

    cfg = RewardConfig()
    requests = make_requests(args.responses)
    start = time.perf_counter()
    direct = [score_response(r.response, r.target, cfg, r.logprobs) for r in requests]
    direct_rate = len(requests) / (time.perf_counter() - start)

    rows = []
    runtime = start_ray(RayConfig())
    try:
        for n in [int(x) for x in args.actors.split(",")]:
            pool = RewardPool(cfg, RewardPoolConfig(num_workers=n, num_cpus_per_worker=0), local=False)
            pool.score(requests[: args.chunk_size * n], args.chunk_size)  # warm-up: every actor imports and scores
            start = time.perf_counter()
            scored = pool.score(requests, args.chunk_size)
            seconds = time.perf_counter() - start
            pool.shutdown()
            if [s.total for s in scored] != [d.total for d in direct]:
                raise SystemExit(f"pool of {n} scored differently from the driver")
            rows.append({"actors": n, "responses_per_s": len(requests) / seconds,
                         "responses_per_s_per_actor": len(requests) / seconds / n})
    finally:
        runtime.shutdown()
    base = rows[0]["responses_per_s"]
    for r in rows:
        r["scaling_vs_1_actor"] = r["responses_per_s"] / base
    emit({"responses": len(requests), "chunk_size": args.chunk_size, "direct_responses_per_s": direct_rate,
          "pool": rows, "pool1_over_direct": base / direct_rate}, args.json_out)


if __name__ == "__main__":
    main()
