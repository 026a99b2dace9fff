"""The errors that are the user's to fix. The CLI prints their message as one line and exits 2 (`--verbose` shows
the traceback); anything else is a bug or a crashed worker and keeps its traceback. Pure: stdlib only."""

from __future__ import annotations


class UserError(Exception):
    """Something the user gave is wrong: a config key, a path, a data line. The message names the key, the path or
    FILE:LINE, and what to change."""


class DataError(UserError, ValueError):
    """A sessions or examples source that does not parse, or holds nothing usable; the message names FILE:LINE (or
    SOURCE row N) and, for an empty result, the config key that emptied it. A ValueError, as data errors were."""
