"""A generated product catalog: categories, brands, titles, prices, ratings, review counts, features."""

from __future__ import annotations

import random
from dataclasses import dataclass

# category -> (product nouns, feature adjectives, brands, (min price, max price))
CATEGORIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[float, float]]] = {
    "outdoor": (("hiking backpack", "tent", "sleeping bag", "trekking poles", "headlamp"),
                ("waterproof", "lightweight", "ultralight", "insulated", "compact", "durable"),
                ("Osprey", "TrailCo", "Summit Gear", "NorthPeak", "Kelty"), (15.0, 320.0)),
    "shoes": (("running shoes", "trail running shoes", "hiking boots", "sneakers", "sandals"),
              ("breathable", "cushioned", "waterproof", "wide", "lightweight", "slip-on"),
              ("Brooks", "Salomon", "Stride", "Asics", "Merrell"), (25.0, 220.0)),
    "kitchen": (("coffee maker", "chef knife", "nonstick pan", "blender", "water bottle"),
                ("stainless steel", "programmable", "dishwasher safe", "insulated", "compact", "ceramic"),
                ("Cuisio", "HomeChef", "Brewline", "Zwilling", "Hydro Peak"), (10.0, 250.0)),
    "electronics": (("wireless earbuds", "bluetooth speaker", "phone charger", "smartwatch", "usb-c hub"),
                    ("noise cancelling", "waterproof", "fast charging", "portable", "long battery"),
                    ("Soundwave", "Ankor", "Volt", "Pixelon", "JBX"), (12.0, 300.0)),
    "home": (("desk lamp", "throw blanket", "air purifier", "storage bins", "office chair"),
             ("adjustable", "dimmable", "soft", "quiet", "ergonomic", "stackable"),
             ("Lumen", "CozyNest", "PureAir", "Hearth & Co", "Ergo Plus"), (12.0, 280.0)),
}
SIZES = ("S", "M", "L", "XL")


@dataclass(frozen=True)
class Product:
    title: str
    category: str
    noun: str
    brand: str
    features: tuple[str, ...]
    price: float
    rating: float
    num_reviews: int
    sizes: tuple[str, ...]

    def words(self) -> set[str]:
        return set(self.title.lower().split())


def slug(text: str) -> str:
    """Element-name form of a label: lowercase, spaces/punctuation to underscores ("Hearth & Co" -> hearth_co)."""
    out, prev_us = [], False
    for ch in text.lower():
        if ch.isalnum():
            out.append(ch)
            prev_us = False
        elif not prev_us:
            out.append("_")
            prev_us = True
    return "".join(out).strip("_")


def build_catalog(rng: random.Random, products_per_noun: int = 8) -> tuple[Product, ...]:
    products: list[Product] = []
    titles: set[str] = set()
    for category, (nouns, features, brands, (lo, hi)) in CATEGORIES.items():
        for noun in nouns:
            made = 0
            while made < products_per_noun:
                brand = rng.choice(brands)
                feats = tuple(sorted(rng.sample(features, rng.randint(1, 2))))
                model = rng.choice(("", " Pro", " 2", " Lite", " Max", " X", " Plus", " 3"))
                title = f"{brand} {' '.join(f.title() for f in feats)} {noun.title()}{model}"
                if title in titles:
                    continue
                titles.add(title)
                price = round(rng.uniform(lo, hi * 0.6) + rng.choice((0, 0, 0, hi * 0.4)), 0) - 0.01
                rating = round(min(5.0, max(2.5, rng.gauss(4.1, 0.45))), 1)
                sizes = SIZES if category == "shoes" or noun in ("sleeping bag", "throw blanket") else ()
                products.append(Product(title, category, noun, brand, feats, max(price, 4.99), rating,
                                        int(rng.lognormvariate(5.5, 1.3)) + 3, sizes))
                made += 1
    return tuple(products)
