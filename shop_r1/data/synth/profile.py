"""The shopper profile of the synthetic shop's version 2: what the shopper wants and how they shop, written at the top
of every prompt of their session (`Session.persona`), and read back from it by the oracle.

    Looking for: tent
    Must have: waterproof
    Budget: under $100
    Brand: Osprey                      ("any" when the shopper has no preference)
    Uses filters: yes
    Minimum rating: 4.0 stars
    Patience: looks at up to 2 products and tries up to 3 searches
    Checkout: buy now                  (or "add to cart")

`render` and `parse` are inverses; a profile is everything the shopper's policy (`policy.decide`) reads besides the
screen and the session's own history.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from shop_r1.data.prompts import PERSONA_HEADER
from shop_r1.data.synth.catalog import CATEGORIES

BUDGETS = (25, 50, 100, 200)
"""Budgets are the upper ends of the shop's price refinements: a shopper who uses filters picks the refinement that
ends at the budget (e.g. "$50 to $100" for under $100), so they then see only that band."""
MIN_RATINGS = (0.0, 3.5, 4.0, 4.3)
PROFILE_HEADER = PERSONA_HEADER


@dataclass(frozen=True)
class Profile:
    category: str
    noun: str
    feature: str
    budget: int
    brand: str | None
    uses_filters: bool
    min_rating: float
    max_views: int
    max_searches: int
    buy_now: bool

    def queries(self) -> tuple[str, ...]:
        """The searches this shopper tries, in order (the first on the home page)."""
        third = f"{self.brand.lower()} {self.noun}" if self.brand else f"{self.noun} under {self.budget}"
        return (f"{self.feature} {self.noun}", self.noun, third, f"best {self.noun}")[: self.max_searches]

    def render(self) -> str:
        return "\n".join([
            f"Looking for: {self.noun}",
            f"Must have: {self.feature}",
            f"Budget: under ${self.budget}",
            f"Brand: {self.brand or 'any'}",
            f"Uses filters: {'yes' if self.uses_filters else 'no'}",
            f"Minimum rating: {self.min_rating:.1f} stars",
            f"Patience: looks at up to {self.max_views} products and tries up to {self.max_searches} searches",
            f"Checkout: {'buy now' if self.buy_now else 'add to cart'}",
        ])


_LINE = re.compile(r"^(Looking for|Must have|Budget|Brand|Uses filters|Minimum rating|Patience|Checkout): (.*)$")
_PATIENCE = re.compile(r"looks at up to (\d+) products and tries up to (\d+) searches")


def _category_of(noun: str) -> str:
    for category, (nouns, _, _, _) in CATEGORIES.items():
        if noun in nouns:
            return category
    raise ValueError(f"profile: unknown product noun {noun!r}")


def parse_profile(text: str) -> Profile:
    """The inverse of `Profile.render` (lines in any order, other lines ignored); a missing field is an error."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            fields[m.group(1)] = m.group(2).strip()
    missing = [k for k in ("Looking for", "Must have", "Budget", "Brand", "Uses filters", "Minimum rating",
                           "Patience", "Checkout") if k not in fields]
    if missing:
        raise ValueError(f"profile: missing {missing}")
    patience = _PATIENCE.search(fields["Patience"])
    budget = re.search(r"\$(\d+)", fields["Budget"])
    rating = re.match(r"([\d.]+)", fields["Minimum rating"])
    if patience is None or budget is None or rating is None:
        raise ValueError(f"profile: cannot read {fields}")
    noun = fields["Looking for"]
    return Profile(category=_category_of(noun), noun=noun, feature=fields["Must have"], budget=int(budget.group(1)),
                   brand=None if fields["Brand"] == "any" else fields["Brand"],
                   uses_filters=fields["Uses filters"] == "yes", min_rating=float(rating.group(1)),
                   max_views=int(patience.group(1)), max_searches=int(patience.group(2)),
                   buy_now=fields["Checkout"] == "buy now")


def make_profile(rng: random.Random) -> Profile:
    category = rng.choice(list(CATEGORIES))
    nouns, features, brands, (lo, _) = CATEGORIES[category]
    return Profile(category=category, noun=rng.choice(nouns), feature=rng.choice(features),
                   budget=rng.choice([b for b in BUDGETS if b > lo + 10]),
                   brand=rng.choice(brands) if rng.random() < 0.35 else None,
                   uses_filters=rng.random() < 0.25, min_rating=rng.choice(MIN_RATINGS),
                   max_views=rng.randint(1, 3), max_searches=rng.randint(2, 4), buy_now=rng.random() < 0.5)
