"""Simplified HTML pages in the style of the paper's source (UXAgent's simplification): structure, visible text and
interactive elements only, no scripts or styles. Every interactive element carries a unique dotted `name`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from shop_r1.data.synth.catalog import CATEGORIES, Product, slug

SEARCH_INPUT = "search_input"
PRICE_BUCKETS = (("under_25", 0.0, 25.0, "Under $25"), ("25_to_50", 25.0, 50.0, "$25 to $50"),
                 ("50_to_100", 50.0, 100.0, "$50 to $100"), ("100_to_200", 100.0, 200.0, "$100 to $200"),
                 ("200_and_above", 200.0, 1e9, "$200 & Above"))


@dataclass(frozen=True)
class Filters:
    brand: str | None = None
    price_bucket: str | None = None
    min_rating_4: bool = False


def _header(query: str = "", cart_count: int = 0) -> str:
    return (f'<header><a name="nav.home">Home</a>'
            f'<form><input type="text" name="{SEARCH_INPUT}" placeholder="Search" value="{escape(query)}"/>'
            f'<button name="search_button">Search</button></form>'
            f'<a name="nav.cart">Cart ({cart_count})</a></header>')


def view_name(product: Product, section: str = "search_results") -> str:
    return f"{section}.{product.title}.view_product"


def home_page(deals: Sequence[Product]) -> str:
    cats = "".join(f'<li><a name="nav.category.{c}">{c.title()}</a></li>' for c in CATEGORIES)
    deal_items = "".join(f'<li><a name="{view_name(p, "todays_deals")}">{escape(p.title)}</a> '
                         f'<span>${p.price:.2f}</span></li>' for p in deals)
    return (f"<html><body>{_header()}<nav><ul>{cats}</ul></nav>"
            f"<section><h2>Today's Deals</h2><ul>{deal_items}</ul></section></body></html>")


def price_bucket_of(price: float) -> str:
    for key, lo, hi, _ in PRICE_BUCKETS:
        if lo <= price < hi:
            return key
    return PRICE_BUCKETS[-1][0]


def results_page(query: str, results: Sequence[Product], brands: Sequence[str], filters: Filters, page: int,
                 has_next: bool, cart_count: int) -> str:
    brand_items = "".join(
        f'<li><input type="checkbox" name="refinements.brand.{slug(b)}"{" checked" if filters.brand == b else ""}/>'
        f"<label>{escape(b)}</label></li>" for b in brands)
    current = ' aria-current="true"'
    price_items = "".join(
        f'<li><a name="refinements.price.{key}"{current if filters.price_bucket == key else ""}>'
        f"{escape(label)}</a></li>" for key, _, _, label in PRICE_BUCKETS)
    rating = (f'<li><a name="refinements.rating.4_stars_up"{current if filters.min_rating_4 else ""}>'
              "4 Stars &amp; Up</a></li>")
    if results:
        items = "".join(
            f'<div class="result"><a name="{view_name(p)}">{escape(p.title)}</a>'
            f'<span class="price">${p.price:.2f}</span>'
            f'<span class="rating">{p.rating} out of 5 stars ({p.num_reviews:,})</span></div>' for p in results)
    else:
        items = f'<p>No results for "{escape(query)}".</p>'
    pager = '<a name="pagination.next">Next</a>' if has_next else ""
    return (f"<html><body>{_header(query, cart_count)}"
            f"<aside><h3>Brand</h3><ul>{brand_items}</ul><h3>Price</h3><ul>{price_items}</ul>"
            f"<h3>Customer Reviews</h3><ul>{rating}</ul></aside>"
            f'<main><div>Page {page} of results for "{escape(query)}"</div>'
            f'<select name="sort_by"><option>Featured</option><option>Price: Low to High</option></select>'
            f"{items}{pager}</main></body></html>")


def product_page(p: Product, related: Sequence[Product], query: str, cart_count: int) -> str:
    feats = "".join(f"<li>{escape(f.capitalize())}</li>" for f in p.features)
    sizes = "".join(f'<button name="product_options.size.{s.lower()}">{s}</button>' for s in p.sizes)
    sizes_html = f'<div class="options"><span>Size:</span>{sizes}</div>' if sizes else ""
    rel = "".join(f'<li><a name="{view_name(r, "related")}">{escape(r.title)}</a> <span>${r.price:.2f}</span></li>'
                  for r in related)
    return (f"<html><body>{_header(query, cart_count)}"
            f'<a name="back_to_results">Back to results</a>'
            f"<main><h1>{escape(p.title)}</h1><div>Brand: {escape(p.brand)}</div>"
            f'<span class="price">${p.price:.2f}</span>'
            f'<span class="rating">{p.rating} out of 5 stars ({p.num_reviews:,} ratings)</span>'
            f"<ul class=\"features\">{feats}</ul>{sizes_html}"
            f'<button name="add_to_cart">Add to Cart</button><button name="buy_now">Buy Now</button></main>'
            f"<section><h3>Customers also viewed</h3><ul>{rel}</ul></section></body></html>")


def cart_page(items: Sequence[Product]) -> str:
    rows = "".join(f"<li>{escape(p.title)} <span>${p.price:.2f}</span></li>" for p in items)
    total = sum(p.price for p in items)
    return (f"<html><body>{_header('', len(items))}<main><h1>Shopping Cart</h1><ul>{rows}</ul>"
            f"<div>Subtotal: ${total:.2f}</div>"
            f'<button name="proceed_to_checkout">Proceed to checkout</button>'
            f'<a name="continue_shopping">Continue shopping</a></main></body></html>')
