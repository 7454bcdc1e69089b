"""Closest-name hints for messages: ``unknown setting 'blok_size'; did you mean 'block_size'?``."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice most like ``name``, or None when none is close (difflib ratio below 0.6)."""
    matches = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(name: str, choices: Iterable[str], quote: bool = True) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, or "" when none is close."""
    return meant(closest(name, choices), quote)


def meant(match: str | None, quote: bool = True) -> str:
    """``"; did you mean 'x'?"`` for a match found (``closest``), or "" for None."""
    if match is None:
        return ""
    return f"; did you mean {match!r}?" if quote else f"; did you mean {match}?"
