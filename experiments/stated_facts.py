"""What a model's rationales say about the shopper, against the profile in its prompt, and whether its action follows
the shop's rule from what its own rationale says (the profiled shop, data.synth_version 2-4).

    python experiments/stated_facts.py EXAMPLES.jsonl PREDICTIONS.jsonl[.gz] [...]

- limits: on results pages the rationale states the profile's limits ("of my 2 products ... of my 3 searches" in
  version 2, "My patience: products two, searches three" in version 3, "... searches thrice" in version 4); how
  often each equals the profile's.
- want: "<feature> <noun>" (version 2) or "a <feature> <noun> under $<budget>" (version 3) against the profile's.
- stop or search: answers whose rationale says nothing on the page fits. The shop's rule is then: search again while
  searches made < the limit, else leave. Counted from the rationale's *own* numbers (whatever the profile says), so
  it measures whether the model acts on what it wrote, split by whether its stated searches are used up.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shop_r1.data.examples import load_rl_examples  # noqa: E402
from shop_r1.data.synth.policy import profile_of_prompt  # noqa: E402
from shop_r1.data.synth.profile import NUMBER_WORDS, SEARCH_VALUE_PATTERN, SEARCH_WORDS, Profile  # noqa: E402

_WORDS = {w: n for n, w in NUMBER_WORDS.items()}
_SEARCH_WORDS = {**_WORDS, **{w: n for n, w in SEARCH_WORDS.items()}}
_LIMITS = (re.compile(rf"My patience: products (\w+), searches ({SEARCH_VALUE_PATTERN}); "
                      r"I've opened (\d+) and searched (\d+)"),
           re.compile(r"I've opened (\d+) of my (\d+) products and made (\d+) of my (\d+) searches"))
_WANT = (re.compile(r"I want (a .*? under \$\d+)"), re.compile(r"(?:I need a|is not a|nothing here is a) (.*?) under"))
_NOTHING_FITS = ("nothing here fits", "nothing here is a")


def _stated(rationale: str) -> tuple[int, int, int] | None:
    """(products limit, searches limit, searches made) as the rationale states them, or None."""
    m = _LIMITS[0].search(rationale)
    if m:
        limits = (_WORDS.get(m.group(1)), _SEARCH_WORDS.get(m.group(2)))
        return None if None in limits else (limits[0], limits[1], int(m.group(4)))
    m = _LIMITS[1].search(rationale)
    return (int(m.group(2)), int(m.group(4)), int(m.group(3))) if m else None


def _want_right(rationale: str, p: Profile) -> bool | None:
    m = _WANT[0].search(rationale)
    if m:
        return m.group(1) == p.want
    m = _WANT[1].search(rationale)
    return None if m is None else m.group(1) == f"{p.feature} {p.noun}"


def stated_facts(profiles: Mapping[str, Profile], predictions: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """`profiles`: example id -> the profile its prompt shows; `predictions`: {example_id, response} records."""
    out: dict[str, Any] = {"answers": 0, "unparsed": 0, "limits_stated": 0, "products_limit_right": 0,
                           "searches_limit_right": 0, "want_stated": 0, "want_right": 0,
                           "nothing_fits": {"searches_left": {}, "searches_used_up": {}}}
    for rec in predictions:
        out["answers"] += 1
        try:
            answer = json.loads(rec["response"])
            rationale, kind = str(answer["rationale"]), str(answer["action"]["type"])
        except (ValueError, KeyError, TypeError):
            out["unparsed"] += 1
            continue
        p = profiles.get(rec["example_id"])
        if p is None:
            raise ValueError(f"prediction for example_id {rec['example_id']!r}: no such example in the examples file "
                             "(predictions and examples of different runs?)")
        stated = _stated(rationale)
        if stated is not None:
            out["limits_stated"] += 1
            out["products_limit_right"] += stated[0] == p.max_views
            out["searches_limit_right"] += stated[1] == p.max_searches
            if any(s in rationale for s in _NOTHING_FITS):
                key = "searches_left" if stated[2] < stated[1] else "searches_used_up"
                out["nothing_fits"][key][kind] = out["nothing_fits"][key].get(kind, 0) + 1
        want = _want_right(rationale, p)
        if want is not None:
            out["want_stated"] += 1
            out["want_right"] += want
    left, used = out["nothing_fits"]["searches_left"], out["nothing_fits"]["searches_used_up"]
    broken = left.get("terminate", 0) + sum(v for k, v in used.items() if k != "terminate")
    judged = sum(left.values()) + sum(used.values())
    out["rule_broken_share"] = broken / judged if judged else None
    return out


def _read(path: str | Path) -> list[dict[str, Any]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def render(name: str, r: Mapping[str, Any]) -> str:
    def pct(a: int, b: int) -> str:
        return f"{a}/{b} ({100 * a / b:.0f} %)" if b else "-"

    nf = r["nothing_fits"]
    broken = "-" if r["rule_broken_share"] is None else f"{100 * r['rule_broken_share']:.0f} %"
    stated = r["limits_stated"]
    return (f"{name}: limits stated on {stated} answers: products limit right "
            f"{pct(r['products_limit_right'], stated)}, searches limit right "
            f"{pct(r['searches_limit_right'], stated)}; want right {pct(r['want_right'], r['want_stated'])}; "
            f"'nothing fits' with searches left {nf['searches_left']}, "
            f"with searches used up {nf['searches_used_up']}: the rule broken on {broken}")


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    profiles = {e.example_id: profile_of_prompt(e.prompt) for e in load_rl_examples(argv[0])}
    for path in argv[1:]:
        print(render(path, stated_facts(profiles, _read(path))))


if __name__ == "__main__":
    main(sys.argv[1:])
