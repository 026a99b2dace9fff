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

Wording 3 (the shop's version 3: the same shoppers and actions, other words) writes the profile so that a small model
can copy each fact into its rationale by matching the word before it, as an induction head does:

    Looking for: tent
    Must have: waterproof
    Budget: under $100
    Wants: a waterproof tent under $100  (the rationales' "I want a waterproof tent under $100": " a" -> the phrase)
    Brand: prefer Osprey               (the rationales' "I prefer Osprey")
    Uses filters: yes
    Minimum rating: 4.0 stars
    Patience: products two, searches three   (the rationales' "My patience: products two, searches three")
    Checkout: buy now

In wording 2 the patience numbers follow "up to " in both places (a space token and a digit: nothing tells the two
apart) and the rationales name "a <feature> <noun>" where the profile has the noun first: measured on seed 23's
committed SFT answers (v2_table2), the rationale's patience limit was right on 41 % of results pages (3 values: about
chance) and "<feature> <noun>" on 17-19 %, while the budget (after its own "$") was right on 78 %. What wording 3
changed (experiments/stated_facts.py; README "The main job"): each SFT model then copied one of the two limits on
every page and stated the other at chance (searches on seed 0, products on seed 71), and the wanted phrase on 35-42 %.
On the untuned seeds 113 and 127 the SFT models copied neither: the stated limits were independent of the profile's,
while the counts beside them ("I've opened 1 and searched 2") were right on 95-99 % of pages.

Wording 4 (the shop's version 4) is wording 3 with one change: the two limits take their values from disjoint words,

    Patience: products two, searches thrice   (searches: "twice", "thrice", "four times"; products: "one" .. "three")

In wording 3 both limits are number words from overlapping sets ({one, two, three} and {two, three, four}), so a
head that attends to "the number word in the profile" fetches both and only the word before each value tells them
apart (an induction circuit, which the small model forms for one limit at best). With disjoint words, each limit is
the only word of its kind in the prompt, and one attention head can fetch it by what it is, not by where it is.
Measured on seed 0's validation split (SFT, same recipe): searches limit right 75 % (version 3's SFT model of the same
seed: 100 %; seeds 113 and 127: 37 %, 35 %), products limit 34 %, SFT exact 44.7 % (version 3: 41.8 %). Tried and
dropped: the patience line moved last with one-token values ("fourfold"), so each limit sits a fixed number of
tokens before its copy in the answer: 38 % / 41 %, SFT exact 34.9 %. On seed 113's validation split (version 3's
model of that seed copied neither limit): searches limit right on 100 % of results pages, products limit 36 %.
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
WORDINGS = (2, 3, 4)
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}
SEARCH_WORDS = {2: "twice", 3: "thrice", 4: "four times"}
"""Wording 4's searches limit: no word shared with the products limit's (module docstring)."""
_WORD_NUMBERS = {w: n for n, w in NUMBER_WORDS.items()}
_SEARCH_NUMBERS = {w: n for n, w in SEARCH_WORDS.items()}


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
    wording: int = 2
    """How the profile and the rationales are written (module docstring); the policy's actions do not depend on it."""

    @property
    def want(self) -> str:
        """What the shopper looks for as one phrase ("a waterproof tent under $100"; wording 3)."""
        return f"a {self.feature} {self.noun} under ${self.budget}"

    @property
    def patience(self) -> str:
        """The limits as wordings 3 and 4 write them in the profile and in the rationales."""
        searches = (SEARCH_WORDS if self.wording == 4 else NUMBER_WORDS)[self.max_searches]
        return f"products {NUMBER_WORDS[self.max_views]}, searches {searches}"

    def queries(self) -> tuple[str, ...]:
        """The searches this shopper tries, in order (the first on the home page)."""
        third = f"{self.brand.lower()} {self.noun}" if self.brand else f"{self.noun} under {self.budget}"
        return (f"{self.feature} {self.noun}", self.noun, third, f"best {self.noun}")[: self.max_searches]

    def render(self) -> str:
        if self.wording >= 3:
            return "\n".join([
                f"Looking for: {self.noun}",
                f"Must have: {self.feature}",
                f"Budget: under ${self.budget}",
                f"Wants: {self.want}",
                f"Brand: {'prefer ' + self.brand if self.brand else 'any'}",
                f"Uses filters: {'yes' if self.uses_filters else 'no'}",
                f"Minimum rating: {self.min_rating:.1f} stars",
                f"Patience: {self.patience}",
                f"Checkout: {'buy now' if self.buy_now else 'add to cart'}",
            ])
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


_LINE = re.compile(r"^(Looking for|Must have|Budget|Wants|Brand|Uses filters|Minimum rating|Patience|Checkout): "
                   r"(.*)$")
_PATIENCE = re.compile(r"looks at up to (\d+) products and tries up to (\d+) searches")
SEARCH_VALUE_PATTERN = "|".join(sorted((re.escape(w) for w in SEARCH_WORDS.values()), key=len, reverse=True)) + r"|\w+"
"""A searches limit as written: one of SEARCH_WORDS (longest first, so "four times" is whole) or one word."""
_PATIENCE_WORDS = re.compile(rf"^products (\w+), searches ({SEARCH_VALUE_PATTERN})$")


def _category_of(noun: str) -> str:
    for category, (nouns, _, _, _) in CATEGORIES.items():
        if noun in nouns:
            return category
    raise ValueError(f"profile: unknown product noun {noun!r}")


def parse_profile(text: str) -> Profile:
    """The inverse of `Profile.render` (lines in any order, other lines ignored); a missing field is an error. A
    "Wants" line marks wording 3, and a searches limit in wording 4's words ("thrice") wording 4."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            fields[m.group(1)] = m.group(2).strip()
    missing = [k for k in ("Looking for", "Must have", "Budget", "Brand", "Uses filters", "Minimum rating",
                           "Patience", "Checkout") if k not in fields]
    if missing:
        raise ValueError(f"profile: missing {missing}")
    wording = 3 if "Wants" in fields else 2
    budget = re.search(r"\$(\d+)", fields["Budget"])
    rating = re.match(r"([\d.]+)", fields["Minimum rating"])
    if wording == 3:
        words = _PATIENCE_WORDS.match(fields["Patience"])
        if words and words.group(2) in _SEARCH_NUMBERS:
            wording = 4
        searches = (_SEARCH_NUMBERS if wording == 4 else _WORD_NUMBERS).get(words.group(2)) if words else None
        patience = (_WORD_NUMBERS.get(words.group(1)), searches) if words else None
        brand_text = fields["Brand"].removeprefix("prefer ")
    else:
        digits = _PATIENCE.search(fields["Patience"])
        patience = (int(digits.group(1)), int(digits.group(2))) if digits else None
        brand_text = fields["Brand"]
    if patience is None or None in patience or budget is None or rating is None:
        raise ValueError(f"profile: cannot read {fields}")
    noun = fields["Looking for"]
    profile = Profile(category=_category_of(noun), noun=noun, feature=fields["Must have"],
                      budget=int(budget.group(1)), brand=None if brand_text == "any" else brand_text,
                      uses_filters=fields["Uses filters"] == "yes", min_rating=float(rating.group(1)),
                      max_views=patience[0], max_searches=patience[1], buy_now=fields["Checkout"] == "buy now",
                      wording=wording)
    if wording >= 3 and fields["Wants"] != profile.want:
        raise ValueError(f"profile: 'Wants: {fields['Wants']}' disagrees with its other lines ({profile.want!r})")
    return profile


def make_profile(rng: random.Random, wording: int = 2) -> Profile:
    if wording not in WORDINGS:
        raise ValueError(f"profile wording must be one of {WORDINGS}, got {wording!r}")
    category = rng.choice(list(CATEGORIES))
    nouns, features, brands, (lo, _) = CATEGORIES[category]
    return Profile(category=category, noun=rng.choice(nouns), feature=rng.choice(features),
                   budget=rng.choice([b for b in BUDGETS if b > lo + 10]),
                   brand=rng.choice(brands) if rng.random() < 0.35 else None,
                   uses_filters=rng.random() < 0.25, min_rating=rng.choice(MIN_RATINGS),
                   max_views=rng.randint(1, 3), max_searches=rng.randint(2, 4), buy_now=rng.random() < 0.5,
                   wording=wording)
