"""Shoppers with hidden intents walking the synthetic shop, one decision per page.

An intent (category, product noun, wanted feature, brand preference, budget, minimum rating, patience, readiness to
buy) is never written into the pages; it shows only through the shopper's queries, refinements and rationales. So a
model must read the history to know what the shopper wants, and read the current page to know which element fits
(which result is under budget and well rated, which refinement exists, whether anything matches at all).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from shop_r1.data.synth import pages
from shop_r1.data.synth.catalog import CATEGORIES, Product, slug
from shop_r1.types import Action, Session, Step

RESULTS_PER_PAGE = 6


@dataclass(frozen=True)
class Intent:
    category: str
    noun: str
    feature: str
    brand: str | None
    budget: float
    min_rating: float
    patience: int
    buy_prob: float

    def fits(self, p: Product) -> bool:
        return (p.noun == self.noun and p.price <= self.budget and p.rating >= self.min_rating
                and (self.brand is None or p.brand == self.brand))


@dataclass
class _State:
    query: str = ""
    filters: pages.Filters = field(default_factory=pages.Filters)
    page: int = 1
    results: list[Product] = field(default_factory=list)
    has_next: bool = False
    product: Product | None = None
    viewed: set[str] = field(default_factory=set)
    cart: list[Product] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)


def make_intent(rng: random.Random) -> Intent:
    category = rng.choice(list(CATEGORIES))
    nouns, features, brands, (lo, hi) = CATEGORIES[category]
    return Intent(category=category, noun=rng.choice(nouns), feature=rng.choice(features),
                  brand=rng.choice(brands) if rng.random() < 0.4 else None,
                  budget=float(round(rng.uniform(lo + 10, hi * 0.7), -1) or 20),
                  min_rating=rng.choice((0, 3.5, 4.0, 4.3)),
                  patience=rng.randint(1, 4), buy_prob=rng.uniform(0.05, 0.5))


def _queries(intent: Intent, rng: random.Random) -> list[str]:
    """Query wordings a shopper may try, most natural first, shuffled a little."""
    n, f = intent.noun, intent.feature
    options = [f"{f} {n}", n, f"{n} under {int(intent.budget)}", f"best {f} {n}", f"{n} {f}"]
    if intent.brand:
        options.insert(rng.randint(0, 2), f"{intent.brand.lower()} {n}")
    head, tail = options[:2], options[2:]
    rng.shuffle(tail)
    return head + tail


class CatalogIndex:
    """Word -> products, with a memo of searches: the same query and filters give the same hits every time."""

    def __init__(self, catalog: tuple[Product, ...]) -> None:
        self.catalog = catalog
        self._by_word: dict[str, list[int]] = {}
        for i, p in enumerate(catalog):
            for w in p.words():
                self._by_word.setdefault(w, []).append(i)
        self._memo: dict[tuple[str, pages.Filters], list[Product]] = {}

    def search(self, query: str, filters: pages.Filters) -> list[Product]:
        key = (query, filters)
        if key not in self._memo:
            self._memo[key] = self._search(query, filters)
        return self._memo[key]

    def _search(self, query: str, filters: pages.Filters) -> list[Product]:
        overlap: dict[int, int] = {}
        for w in set(query.lower().split()):
            for i in self._by_word.get(w, ()):
                overlap[i] = overlap.get(i, 0) + 1
        scored = []
        for i, n in overlap.items():
            p = self.catalog[i]
            if filters.brand and p.brand != filters.brand:
                continue
            if filters.price_bucket and pages.price_bucket_of(p.price) != filters.price_bucket:
                continue
            if filters.min_rating_4 and p.rating < 4.0:
                continue
            scored.append((-n, -p.num_reviews, p.title, p))
        scored.sort(key=lambda t: t[:3])
        return [t[3] for t in scored]


def _say(rng: random.Random, *options: str) -> str:
    return rng.choice(options)


class Shopper:
    def __init__(self, index: CatalogIndex, intent: Intent, rng: random.Random) -> None:
        self.index, self.intent, self.rng = index, intent, rng
        self.state = _State()
        self.plan = _queries(intent, rng)
        self.steps: list[Step] = []

    # --- pages -------------------------------------------------------------------------------------------------
    def _results_html(self) -> str:
        s = self.state
        all_hits = self.index.search(s.query, s.filters)
        start = (s.page - 1) * RESULTS_PER_PAGE
        s.results = all_hits[start:start + RESULTS_PER_PAGE]
        s.has_next = len(all_hits) > start + RESULTS_PER_PAGE
        brands = self._page_brands()
        return pages.results_page(s.query, s.results, brands, s.filters, s.page, s.has_next, len(s.cart))

    def _page_brands(self) -> list[str]:
        """The brand refinements a results page shows: up to six brands among the query's hits."""
        return sorted({p.brand for p in self.index.search(self.state.query, pages.Filters())})[:6]

    def _product_html(self, p: Product) -> str:
        related = [q for q in self.index.search(p.noun, pages.Filters()) if q.noun == p.noun and q.title != p.title][:3]
        return pages.product_page(p, related, self.state.query, len(self.state.cart))

    # --- decisions ---------------------------------------------------------------------------------------------
    def _step(self, html: str, action: Action, rationale: str) -> None:
        self.steps.append(Step(observation=html, action=action, rationale=rationale))

    def _search(self, html: str, first: bool) -> str:
        s, it, rng = self.state, self.intent, self.rng
        remaining = [q for q in self.plan if q not in s.queries]
        query = remaining[0] if remaining else f"{it.feature} {it.noun} {rng.randint(2, 9)}"
        budget = f" under ${it.budget:.0f}" if rng.random() < 0.6 else ""
        if first:
            why = _say(rng, f"I'm looking for a {it.feature} {it.noun}{budget}, so I'll start by searching for it.",
                       f"I need a new {it.noun} and want it to be {it.feature}, so I'll search for \"{query}\".",
                       f"I want to find a good {it.noun}{budget}; searching is the fastest way to see options.")
        else:
            why = _say(rng, f"These results don't show the {it.feature} {it.noun} I want, so I'll try \"{query}\".",
                       f"Nothing here fits what I'm after, so I'll rephrase my search as \"{query}\".",
                       f"I'll search again with different words to find a {it.noun} that suits me better.")
        self._step(html, Action("type_and_submit", pages.SEARCH_INPUT, query), why)
        s.query, s.filters, s.page = query, pages.Filters(), 1
        s.queries.append(query)
        return self._results_html()

    def _terminate(self, html: str) -> None:
        it, rng = self.intent, self.rng
        why = _say(rng, f"I can't find a {it.noun} that fits my budget of ${it.budget:.0f}, so I'll stop here.",
                   "None of these options are what I'm looking for, so I'm closing the window.",
                   f"I've looked enough; nothing here is the {it.feature} {it.noun} I want, so I'll leave.",
                   "These prices and ratings don't convince me, so I'll come back another time.")
        self._step(html, Action("terminate"), why)

    def _on_results(self, html: str) -> tuple[str, bool]:
        s, it, rng = self.state, self.intent, self.rng
        if it.brand and s.filters.brand is None and it.brand in self._page_brands() and rng.random() < 0.3:
            self._step(html, Action("click", f"refinements.brand.{slug(it.brand)}"),
                       _say(rng, f"I prefer {it.brand}, so I'll filter the results to that brand.",
                            f"I trust {it.brand} for this, so I'll only look at their products."))
            s.filters, s.page = pages.Filters(brand=it.brand), 1
            return self._results_html(), True
        if s.filters.price_bucket is None and s.filters.brand is None and rng.random() < 0.12:
            bucket = pages.price_bucket_of(it.budget - 0.01)
            self._step(html, Action("click", f"refinements.price.{bucket}"),
                       f"My budget is about ${it.budget:.0f}, so I'll narrow the results to that price range.")
            s.filters, s.page = pages.Filters(price_bucket=bucket), 1
            return self._results_html(), True
        fitting = [p for p in s.results if it.fits(p) and p.title not in s.viewed]
        candidates = fitting or ([p for p in s.results if p.title not in s.viewed and p.noun == it.noun]
                                 if rng.random() < 0.2 else [])
        if candidates and rng.random() < 0.6:
            p = candidates[0] if rng.random() < 0.85 else rng.choice(candidates)
            why = (_say(rng, f"The {p.title} is ${p.price:.2f} with {p.rating} stars, which fits my budget, so "
                             "I'll take a closer look.",
                        f"This {it.noun} looks promising and is under ${it.budget:.0f}; I'll open it to check details.")
                   if it.fits(p) else
                   f"The {p.title} catches my eye even though I'm not sure it fits; I'll check it anyway.")
            self._step(html, Action("click", pages.view_name(p)), why)
            s.product = p
            s.viewed.add(p.title)
            return self._product_html(p), True
        if s.has_next and s.page == 1 and rng.random() < 0.15:
            self._step(html, Action("click", "pagination.next"),
                       "Nothing on this page fits, so I'll look at the next page of results.")
            s.page += 1
            return self._results_html(), True
        if len(s.queries) < 4 and len(self.steps) < it.patience and rng.random() < 0.78:
            return self._search(html, first=False), True
        self._terminate(html)
        return "", False

    def _on_product(self, html: str) -> tuple[str, bool]:
        s, it, rng = self.state, self.intent, self.rng
        p = s.product
        assert p is not None
        if it.fits(p) and rng.random() < it.buy_prob:
            if rng.random() < 0.5:
                self._step(html, Action("click", "buy_now"),
                           f"This {it.noun} has what I need at ${p.price:.2f}, so I'll buy it right away.")
                return "", False
            self._step(html, Action("click", "add_to_cart"),
                       f"The {p.title} fits my needs and budget, so I'll add it to my cart.")
            s.cart.append(p)
            cart_html = pages.cart_page(s.cart)
            self._step(cart_html, Action("click", "proceed_to_checkout"),
                       "I have what I came for, so I'll check out now.")
            return "", False
        reason = (f"is over my budget of ${it.budget:.0f}" if p.price > it.budget else
                  f"only has {p.rating} stars" if p.rating < it.min_rating else
                  f"is not from {it.brand}" if it.brand and p.brand != it.brand else "isn't quite what I want")
        roll = rng.random()
        if roll < 0.3:
            self._step(html, Action("click", "back_to_results"),
                       f"This one {reason}, so I'll go back to the results.")
            return self._results_html(), True
        if roll < 0.75 and len(s.queries) < 4:
            return self._search(html, first=False), True
        self._terminate(html)
        return "", False

    def run(self, home_html: str) -> list[Step]:
        html = self._search(home_html, first=True)
        going = True
        while going:
            if len(self.steps) >= self.intent.patience + 2:
                self._terminate(html)
                break
            if self.state.product is not None and 'name="buy_now"' in html:
                html, going = self._on_product(html)
                self.state.product = None if going and 'name="buy_now"' not in html else self.state.product
            else:
                html, going = self._on_results(html)
        return self.steps


def synthesize_session(index: CatalogIndex, deals: list[Product], session_id: str, rng: random.Random) -> Session:
    shopper = Shopper(index, make_intent(rng), rng)
    steps = shopper.run(pages.home_page(deals))
    return Session(session_id=session_id, steps=tuple(steps))
