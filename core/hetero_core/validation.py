"""Pydantic's validation errors as one line a user can act on, each problem named by its field."""

from __future__ import annotations

from collections.abc import Iterable

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
