"""What RL changed against SFT, paired by example: the action types it flipped, and whether it names better where
both models chose the target's type.

    python experiments/type_flips.py SFT_PREDICTIONS.jsonl[.gz] RL_PREDICTIONS.jsonl[.gz] [...more RL files]

- flips: examples where the two models answer with different action types (an unparseable answer counts as a type
  of its own), split into gained (RL's type is the target's, SFT's is not), lost (the reverse) and neither; and
  how many of them each model got exactly right (a gained terminate is exact, a gained click only with its name).
- same right type: examples where both answer with the target's click or type_and_submit type; exact match of each
  there. A rise here is RL naming the element or writing the query better; a rise of RL's exact on its own
  right-type answers alone can be selection (RL keeping only the easier clicks), which this pairing rules out.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shop_r1.metrics import Predictions, load_predictions  # noqa: E402
from shop_r1.reward.action import exact_match  # noqa: E402
from shop_r1.reward.format import parse_response  # noqa: E402

UNPARSED = "unparsed"


def type_flips(sft: Predictions, rl: Predictions) -> dict[str, Any]:
    """The counts above; `rl` is aligned to `sft`'s example ids (both must hold the same ids, once each)."""
    extra = set(rl.example_ids) - set(sft.example_ids)
    if extra or len(set(rl.example_ids)) != len(rl.example_ids):
        raise ValueError(f"the two files hold different examples ({len(extra)} only in the second, e.g. "
                         f"{sorted(extra)[:1]}, or an id twice): predictions of different runs?")
    rl = rl.select(sft.example_ids)
    flips: Counter[str] = Counter()
    same: dict[str, Counter[str]] = {}
    for target, other, a, b, eid in zip(sft.targets, rl.targets, sft.responses, rl.responses, sft.example_ids):
        if other != target:
            raise ValueError(f"example {eid!r}: the two files give different targets (predictions of different runs?)")
        pa, pb = parse_response(a), parse_response(b)
        ta = pa.action.type if pa else UNPARSED
        tb = pb.action.type if pb else UNPARSED
        if ta != tb:
            flips["gained" if tb == target.type else "lost" if ta == target.type else "neither"] += 1
            flips["sft_exact"] += bool(pa) and exact_match(pa.action, target)
            flips["rl_exact"] += bool(pb) and exact_match(pb.action, target)
        elif ta == target.type and target.type != "terminate":
            row = same.setdefault(target.type, Counter())
            row["n"] += 1
            row["sft_exact"] += exact_match(pa.action, target)
            row["rl_exact"] += exact_match(pb.action, target)
    return {"n": len(sft.example_ids), "flips": dict(flips), "same_right_type": {k: dict(v) for k, v in same.items()}}


def render(name: str, r: dict[str, Any]) -> str:
    f = r["flips"]
    same = "; ".join(f"{t} exact {v['sft_exact']} -> {v['rl_exact']} of {v['n']}"
                     for t, v in sorted(r["same_right_type"].items()))
    return (f"{name}: type flips gained {f.get('gained', 0)}, lost {f.get('lost', 0)}, neither {f.get('neither', 0)} "
            f"(of {r['n']}), exact there {f.get('sft_exact', 0)} -> {f.get('rl_exact', 0)}; both the target's type: "
            f"{same}")


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit(__doc__)
    sft = load_predictions(argv[0])
    for path in argv[1:]:
        print(render(path, type_flips(sft, load_predictions(path))))


if __name__ == "__main__":
    main(sys.argv[1:])
