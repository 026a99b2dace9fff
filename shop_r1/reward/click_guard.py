"""The click guard (`reward.click_guard`): a click's ROUGE value only for the element the shopper actually clicked.

Table 1 pays DARS * ROUGE-L(name) for any predicted name within the threshold of the target's, which pays names
that exist on no page and near-misses that name a *different* element (two product links at ROUGE 0.94). With the
guard, a click keeps its value term only if

    1. the predicted name is an element name on the current page (the target's own name always counts as on it, so
       an exact answer is never punished for an element the extraction missed), and
    2. no other element name on that page matches the predicted name better (ROUGE-L) than the target's name does.

A predicted name that is itself another element of the page matches itself at 1.0, so it passes only when its ROUGE
tokens equal the target's: in effect the value is paid for the target's element (up to tokenisation), which is what
the evaluation's exact match asks. Element names are the page HTML's `name` attributes
(`shop_r1/data/pages.py: page_element_names`, read when prompts are encoded).
"""

from __future__ import annotations

from collections.abc import Iterable

from shop_r1.data.pages import element_names, page_element_names  # noqa: F401  (the guard's page names)
from shop_r1.reward.rouge import rouge_l


def click_value_allowed(pred_name: str, target_name: str, page_names: Iterable[str]) -> bool:
    """Rules 1 and 2 above. Names are compared stripped (as exact match does); ties with the target pass."""
    pred, target = pred_name.strip(), target_name.strip()
    names = {n.strip() for n in page_names} | {target}
    if pred not in names:
        return False
    target_score = rouge_l(pred, target)
    return all(rouge_l(pred, other) <= target_score for other in names if other != target)
