"""Version 2 of the synthetic shop: shoppers with a visible profile and a known policy, plus a documented noise rate.

Each session's `persona` is its shopper's profile (`profile.Profile.render`), shown at the top of every prompt. Every
step's action is `policy.decide` on the page just rendered and the session's earlier actions, except that with
probability `noise` (from the second step on: the first is never predicted) the shopper does something else the page
allows (`policy.noise_alternatives`, never the rule's own action), and then goes on by the rule from where that led.
So an oracle that reads only the prompt is exact on every step but the noisy ones: its ceiling is 1 - noise.

What stays hard: result pages list several products of one noun with near-identical titles (brand, feature words,
model suffix), so a click must name the right one (where ROUGE-L and DARS matter); choosing it needs the budget and
feature of the profile; queries follow from the profile but must be written out.
"""

from __future__ import annotations

import dataclasses
import random

from shop_r1.data.synth import pages
from shop_r1.data.synth.catalog import Product, slug
from shop_r1.data.synth.policy import MAX_STEPS, decide, noise_alternatives, read_page
from shop_r1.data.synth.profile import Profile, make_profile
from shop_r1.data.synth.shopper import RESULTS_PER_PAGE, CatalogIndex
from shop_r1.types import Action, Session, Step

NOISE_RATIONALES = {
    "terminate": "I've lost interest for now, so I'll close the window.",
    "click": "Something here caught my eye, so I'll click it.",
    "type_and_submit": "I'll try another search to see what else there is.",
}


class ProfiledShopper:
    def __init__(self, index: CatalogIndex, profile: Profile, rng: random.Random, noise: float) -> None:
        self.index, self.profile, self.rng, self.noise = index, profile, rng, noise
        self.by_title = {p.title: p for p in index.catalog}
        self.query, self.filters, self.page = "", pages.Filters(), 1
        self.product: Product | None = None
        self.cart: list[Product] = []

    def _results_html(self) -> str:
        hits = self.index.search(self.query, self.filters)
        start = (self.page - 1) * RESULTS_PER_PAGE
        brands = sorted({p.brand for p in self.index.search(self.query, pages.Filters())})[:6]
        return pages.results_page(self.query, hits[start:start + RESULTS_PER_PAGE], brands, self.filters, self.page,
                                  len(hits) > start + RESULTS_PER_PAGE, len(self.cart))

    def _apply(self, action: Action) -> str | None:
        """The page the action leads to, or None when the session ends."""
        if action.type == "terminate":
            return None
        if action.type == "type_and_submit":
            self.query, self.page = action.text, 1  # the shop keeps the ticked filters across searches
            return self._results_html()
        name = action.name
        if name.startswith("refinements.brand."):
            label = next(p.brand for p in self.index.catalog if f"refinements.brand.{slug(p.brand)}" == name)
            self.filters, self.page = dataclasses.replace(self.filters, brand=label), 1
            return self._results_html()
        if name.startswith("refinements.price."):
            bucket = name.removeprefix("refinements.price.")
            self.filters, self.page = dataclasses.replace(self.filters, price_bucket=bucket), 1
            return self._results_html()
        if name == "pagination.next":
            self.page += 1
            return self._results_html()
        if name.endswith(".view_product"):
            title = name.removeprefix("search_results.").removesuffix(".view_product")
            self.product = self.by_title[title]
            related = [q for q in self.index.search(self.product.noun, pages.Filters())
                       if q.noun == self.product.noun and q.title != title][:3]
            return pages.product_page(self.product, related, self.query, len(self.cart))
        if name == "back_to_results":
            return self._results_html()
        if name == "add_to_cart" and self.product is not None:
            self.cart.append(self.product)
            return pages.cart_page(self.cart)
        return None  # buy_now, proceed_to_checkout: the purchase ends the session

    def run(self, home_html: str) -> list[Step]:
        steps: list[Step] = []
        history: list[Action] = []
        html: str | None = home_html
        while html is not None:
            view = read_page(html)
            decision = decide(self.profile, view, history)
            action, rationale = decision.action, decision.rationale
            if steps and len(history) < MAX_STEPS and self.rng.random() < self.noise:  # MAX_STEPS is a hard stop
                others = [a for a in noise_alternatives(self.profile, view, history) if a != action]
                if others:
                    action = self.rng.choice(others)
                    rationale = NOISE_RATIONALES[action.type]
            steps.append(Step(observation=html, action=action, rationale=rationale))
            history.append(action)
            html = self._apply(action)
        return steps


def synthesize_profiled_session(index: CatalogIndex, deals: list[Product], session_id: str, rng: random.Random,
                                noise: float, wording: int = 2) -> Session:
    profile = make_profile(rng, wording)
    steps = ProfiledShopper(index, profile, rng, noise).run(pages.home_page(deals))
    return Session(session_id=session_id, steps=tuple(steps), persona=profile.render())
