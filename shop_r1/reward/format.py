"""The format check: is a response exactly one JSON object `{"rationale": str, "action": {...}}`?

Format-valid means: the whole text, stripped, is one JSON object with a string `rationale` and an object `action`
whose `type` is click, type_and_submit or terminate, and whose `name` / `text`, where present, are strings. Extra
keys are allowed (the paper's schema does not forbid them). Rejected as well, by our choice:
- duplicate keys in any object (which value would count is ambiguous; models exploit such ambiguity);
- NaN / Infinity (not JSON);
- strings with lone surrogates in `rationale`, `name` or `text` (they cannot be written back as UTF-8).
`parse_response` never raises: anything else, however hostile, returns None.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring

from shop_r1.types import ACTION_TYPES, Action, ParsedResponse

_WS = re.compile(r"[ \t\n\r]*")


class _Reject(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _Reject(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> object:
    raise _Reject(f"{name} is not JSON")


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constants)


def _utf8_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _rationale_span(s: str) -> tuple[int, int]:
    """Character span of the top-level `rationale` string's content in `s` (a valid JSON object, no outer space)."""
    i = _WS.match(s, 1).end()
    span = (0, 0)
    while s[i] != "}":
        key, i = scanstring(s, i + 1)
        i = _WS.match(s, i).end() + 1  # past ':'
        i = _WS.match(s, i).end()
        start = i
        _, i = _DECODER.raw_decode(s, i)
        if key == "rationale":
            span = (start + 1, i - 1)  # inside the quotes
        i = _WS.match(s, i).end()
        if s[i] == ",":
            i = _WS.match(s, i + 1).end()
    return span


def parse_response(text: object) -> ParsedResponse | None:
    """The parsed rationale and action of a format-valid response, else None. Never raises."""
    if not isinstance(text, str):
        return None
    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return None
    try:
        obj = _DECODER.decode(stripped)
    except (ValueError, RecursionError):  # _Reject and JSONDecodeError are ValueErrors
        return None
    if not isinstance(obj, dict):
        return None
    rationale, action = obj.get("rationale"), obj.get("action")
    if not isinstance(rationale, str) or not isinstance(action, dict):
        return None
    kind = action.get("type")
    if kind not in ACTION_TYPES:
        return None
    name, typed = action.get("name", ""), action.get("text", "")
    if not isinstance(name, str) or not isinstance(typed, str):
        return None
    if not (_utf8_ok(rationale) and _utf8_ok(name) and _utf8_ok(typed)):
        return None
    offset = len(text) - len(text.lstrip())
    try:
        start, end = _rationale_span(stripped)
    except (ValueError, RecursionError, IndexError):  # cannot happen for a decoded object; be safe, not sorry
        return None
    return ParsedResponse(rationale=rationale, action=Action(kind, name, typed),
                          rationale_span=(start + offset, end + offset))
