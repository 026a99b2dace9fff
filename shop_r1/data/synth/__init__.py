"""The synthetic shop: a seeded, deterministic stand-in for the paper's proprietary sessions.

`synthesize_sessions(n, seed, version, noise)` builds one catalog from the seed, then n shoppers, each with its own
RNG derived from (seed, index), so a session does not change when more sessions are asked for.

- version 2 (`profiled`, the default of `data.synth_version`): each shopper has a profile shown in every prompt and a
  policy that reads only the profile, the page and the session's own actions, with a share `noise` of steps done
  otherwise; the best possible exact match is known (`ceilings`).
- version 3: version 2's shoppers, pages and actions step for step (the same random streams), with the profile and
  the rationales worded so that each fact a decision needs is copied next to it (`profile.py`, wording 3): a small
  model copies by matching the word before a fact, and version 2's wording gave it nothing to match.
- version 4: version 3 with the searches limit in words no other profile value uses ("searches thrice" where
  version 3 has "searches three"; `profile.py`, wording 4), so each limit can be fetched by what it is.
- version 1 (`shopper`): the paper-setting shop of the committed Tables 2, 4, 5 and Figure 2: hidden intents, coin
  flips and a hidden patience decide most steps (re-simulating it from its true hidden state reaches about 53 %
  exact; rules on what the prompt shows 28-35 %).
"""

from __future__ import annotations

import random

from shop_r1.data.synth.catalog import build_catalog
from shop_r1.data.synth.shopper import CatalogIndex, synthesize_session
from shop_r1.types import Session

SYNTH_VERSIONS = (1, 2, 3, 4)
PRODUCTS_PER_NOUN = {1: 8, 2: 12, 3: 12, 4: 12}
"""Versions 2-4 list more products per noun: more near-identical titles on a results page."""


def synthesize_sessions(num_sessions: int, seed: int, version: int = 1, noise: float = 0.1) -> list[Session]:
    from shop_r1.data.synth.profiled import synthesize_profiled_session

    if num_sessions < 0:
        raise ValueError(f"num_sessions must be >= 0, got {num_sessions}")
    if version not in SYNTH_VERSIONS:
        raise ValueError(f"synthetic shop version must be one of {SYNTH_VERSIONS}, got {version!r}")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be in [0, 1], got {noise!r}")
    catalog_rng = random.Random(f"catalog-{seed}")
    catalog = build_catalog(catalog_rng, products_per_noun=PRODUCTS_PER_NOUN[version])
    deals = catalog_rng.sample(list(catalog), 4)
    index = CatalogIndex(catalog)
    if version == 1:
        return [synthesize_session(index, deals, f"synth-{seed}-{i:06d}", random.Random(f"session-{seed}-{i}"))
                for i in range(num_sessions)]
    # Versions 3 and 4 draw from version 2's streams: the same shoppers doing the same things, only worded otherwise.
    return [synthesize_profiled_session(index, deals, f"synth{version}-{seed}-{i:06d}",
                                        random.Random(f"session2-{seed}-{i}"), noise, wording=version)
            for i in range(num_sessions)]
