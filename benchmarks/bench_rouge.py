"""ROUGE-L speed: shop_r1.reward.rouge.rouge_l against rouge-score's RougeScorer on the same pairs.

Pairs look like the reward's inputs: click names (3-12 dotted tokens) and search texts (2-8 words), with partial
overlaps. Prints pairs/s for each and the ratio, after checking the two agree on every pair.
Run: python benchmarks/bench_rouge.py [--pairs N]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from rouge_score import rouge_scorer

from shop_r1.reward.rouge import rouge_l

VOCAB = ["search_results", "refinements", "brand", "price", "view_product", "add_to_cart", "waterproof", "hiking",
         "backpack", "running", "shoes", "trail", "men", "women", "size", "10", "black", "red", "wireless", "earbuds",
         "noise", "cancelling", "under", "50", "stainless", "steel", "water", "bottle", "insulated", "32oz"]

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit  # noqa: E402


def make_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        ref = [rng.choice(VOCAB) for _ in range(rng.randint(3, 12) if i % 2 else rng.randint(2, 8))]
        pred = [w if rng.random() < 0.7 else rng.choice(VOCAB) for w in ref]
        sep = "." if i % 2 else " "
        pairs.append((sep.join(pred), sep.join(ref)))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--json-out", default="", help="also write the result JSON here")
    args = parser.parse_args()
    pairs = make_pairs(args.pairs)
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)

    t0 = time.perf_counter()
    ours = [rouge_l(p, r) for p, r in pairs]
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = [scorer.score(r, p)["rougeL"].fmeasure for p, r in pairs]
    t_theirs = time.perf_counter() - t0
    mismatches = sum(a != b for a, b in zip(ours, theirs))
    result = {"pairs": len(pairs), "shop_r1_pairs_per_s": len(pairs) / t_ours,
              "rouge_score_pairs_per_s": len(pairs) / t_theirs, "speedup": t_theirs / t_ours,
              "mismatches": mismatches}
    emit(result, args.json_out)
    if mismatches:
        raise SystemExit(f"{mismatches} pairs differ from rouge-score")


if __name__ == "__main__":
    main()
