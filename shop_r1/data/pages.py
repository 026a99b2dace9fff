"""The element names of a simplified-HTML page: what the click guard (shop_r1/reward/click_guard.py) checks a
predicted click against. Read once per prompt when prompts are encoded (`Prompt.page_names`)."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from shop_r1.types import Message

# A `name` attribute (not `data-name`, `username`), double- or single-quoted, as the simplified HTML writes it.
_NAME_ATTR = re.compile(r"""(?<![\w\-:])name\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)


def element_names(page_html: str) -> tuple[str, ...]:
    """The distinct `name` attribute values of `page_html`, in page order, entities unescaped (`&amp;` -> `&`)."""
    seen: dict[str, None] = {}
    for m in _NAME_ATTR.finditer(page_html):
        name = html.unescape(m.group(1) if m.group(1) is not None else m.group(2))
        if name.strip():
            seen.setdefault(name, None)
    return tuple(seen)


def page_element_names(messages: Sequence[Message]) -> tuple[str, ...]:
    """The element names of the current page: those of the prompt's last user turn (which holds the page the next
    action is taken on). No user turn: ()."""
    for m in reversed(messages):
        if m.role == "user":
            return element_names(m.content)
    return ()
