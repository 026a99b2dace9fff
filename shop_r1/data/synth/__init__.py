"""The synthetic shop: a seeded, deterministic stand-in for the paper's proprietary sessions.

`synthesize_sessions(n, seed)` builds one catalog from the seed, then n shoppers, each with its own RNG derived from
(seed, index), so a session does not change when more sessions are asked for.
"""

from __future__ import annotations

import random

from shop_r1.data.synth.catalog import build_catalog
from shop_r1.data.synth.shopper import CatalogIndex, synthesize_session
from shop_r1.types import Session


def synthesize_sessions(num_sessions: int, seed: int) -> list[Session]:
    if num_sessions < 0:
        raise ValueError(f"num_sessions must be >= 0, got {num_sessions}")
    catalog_rng = random.Random(f"catalog-{seed}")
    catalog = build_catalog(catalog_rng)
    deals = catalog_rng.sample(list(catalog), 4)
    index = CatalogIndex(catalog)
    return [synthesize_session(index, deals, f"synth-{seed}-{i:06d}", random.Random(f"session-{seed}-{i}"))
            for i in range(num_sessions)]
