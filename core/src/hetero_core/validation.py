"""Pydantic's validation errors as one line a user can act on, each problem named by its field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, get_args

from pydantic import ValidationError

from hetero_core.suggest import did_you_mean


def describe_validation_error(exc: ValidationError, where: str, known: Iterable[str] = ()) -> str:
    """One line naming each problem by its field; ``known``: field names to suggest for a typo."""
    known = list(known)
    problems = []
    for error in exc.errors():
        loc = ".".join(str(part) for part in error["loc"]) or "(root)"
        if error["type"] == "extra_forbidden":
            hint = did_you_mean(str(error["loc"][-1]), known) if len(error["loc"]) == 1 else ""
            problems.append(f"{loc}: unknown setting{hint}")
        else:
            value = error.get("input")
            shown = f" (got {value!r})" if not isinstance(value, dict) else ""
            problems.append(f"{loc}: {error['msg']}{shown}")
    return f"invalid {where}: " + "; ".join(problems)


def is_number_field(annotation: Any) -> bool:
    """Whether a setting of this type holds a number (``int``, ``float``, ``int | None``; not ``bool``)."""
    kinds = set(get_args(annotation) or (annotation,)) - {type(None)}
    return bool(kinds) and kinds <= {int, float}


def as_number(text: str) -> int | float | str:
    """``text`` as the number it spells (``"-4"`` -> -4, ``"0.5"`` -> 0.5), other text as it is. For a
    number typed as text (a flag, a ``HETERO_*`` variable): its error then shows a number, ``got -4``,
    as one from a settings file does; a string typed as a string there stays a string (``got '-4'``)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
