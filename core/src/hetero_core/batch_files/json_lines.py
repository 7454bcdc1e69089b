"""JSON lines in and out of a batch run: one bounded decoder for every line read, one encoder for
every line written.

Reading, a line is refused (``LineError``, never a crash) when it is not UTF-8, not JSON (NaN and
Infinity are not JSON), nested deeper than ``MAX_DEPTH``, holds an integer of more than
``MAX_INT_DIGITS`` digits (Python's own int-string limit) or a lone surrogate escape (``"\\ud800"``:
no Unicode text, so it could neither be tokenized nor written back as UTF-8). A float too large for a
double reads as infinity, as Python's float() has it; the checks of the field it is in judge it.
Writing, a record is always valid UTF-8 JSON: a lone surrogate (none should reach it) becomes
U+FFFD, a number JSON cannot hold (NaN, an infinite logprob) null.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from hetero_core.errors import InvalidRequestError

MAX_DEPTH = 128
MAX_INT_DIGITS = 4300
_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)  # a string (skipped) or a bracket
_LONG_DIGITS = re.compile(rf"[0-9]{{{MAX_INT_DIGITS + 1}}}")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


class LineError(InvalidRequestError):
    """A line that cannot be read as one JSON value within the bounds."""


def decode_line(raw: bytes | str) -> Any:
    """The JSON value of one line (a leading byte-order mark is ignored); None for a blank line."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise LineError(f"not UTF-8 text: {exc}") from None
    text = text.lstrip("\ufeff").rstrip("\r\n")  # its newline off: errors at a column of this line
    if not text.strip():
        return None
    _check_depth(text)
    try:
        bounded_int = _bounded_int if _LONG_DIGITS.search(text) else None  # (a callback per int is slow)
        value = json.loads(text, parse_int=bounded_int, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise LineError(f"invalid JSON {_where(exc, text)}: {exc.msg}") from None
    except ValueError as exc:  # int() under a lower limit than ours (PYTHONINTMAXSTRDIGITS)
        raise LineError(f"invalid number: {exc}") from None
    if _SURROGATE_ESCAPE.search(text):  # a pair (an escaped emoji) is fine; a lone one is not
        _check_unicode(value, "")
    return value


def _where(exc: json.JSONDecodeError, text: str) -> str:
    """``at column 17`` of the line (counting characters, a byte-order mark left out), or ``at the end
    of the line (column 17)`` for a line cut short."""
    if "\n" in text:  # several lines in one (not a line of a file)
        return f"at line {exc.lineno} column {exc.colno}"
    column = exc.pos + 1
    return f"at the end of the line (column {column})" if exc.pos >= len(text) else f"at column {column}"


def encode_line(record: Any) -> bytes:
    """One line of UTF-8 JSON, newline included."""
    try:
        text = json.dumps(record, ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(record), ensure_ascii=False, allow_nan=False)
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (_SURROGATE.sub("\ufffd", text) + "\n").encode("utf-8")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _check_depth(text: str) -> None:
    if text.count("[") + text.count("{") <= MAX_DEPTH:  # cannot nest deeper: no scan needed
        return
    depth = 0
    for match in _NESTING.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise LineError(f"nested deeper than {MAX_DEPTH} levels (arrays and objects)")
        elif token in "]}":
            depth -= 1


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise LineError(f"an integer of {len(digits.lstrip('-'))} digits; the limit is {MAX_INT_DIGITS}")
    return int(digits)


def _no_constant(name: str) -> Any:
    raise LineError(f"invalid JSON: {name} is not a JSON value (numbers must be finite)")


def _check_unicode(value: Any, path: str) -> None:
    """Refuse a string (value or object key) holding a lone surrogate, naming where it is."""
    if isinstance(value, str):
        _refuse_surrogate(value, f"'{path}'" if path else "the line")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_unicode(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_surrogate(key, f"a key of '{path}'" if path else "a key")
            _check_unicode(item, f"{path}.{key}" if path else key)


def _refuse_surrogate(text: str, where: str) -> None:
    if match := _SURROGATE.search(text):
        raise LineError(
            f"not valid Unicode: a lone surrogate {match.group()!r} in {where} "
            "(JSON text must be UTF-8; a \\uD800-\\uDFFF escape needs its pair)"
        )
