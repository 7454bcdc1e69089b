"""GuidedDecodingParams: what a request asks its output to be (vLLM's shape), validated once.

Exactly one of ``json`` (a JSON schema, as a dict or its text), ``json_object`` (any JSON object),
``regex``, ``choice`` (one of these strings) or ``grammar`` (an EBNF grammar, for backends that take
one) is set. The schema is stored as compact JSON text (key order kept: properties are generated in
schema order), so the params stay hashable and the same schema compiles once
(``hetero_core.engine.sampling.structured_output`` caches compiled grammars by params).
"""

from __future__ import annotations

import json as json_module
from dataclasses import dataclass
from typing import Any

from hetero_core.errors import InvalidRequestError

KINDS = ("json", "json_object", "regex", "choice", "grammar")
MAX_SPEC_CHARS = 100_000  # a schema, regex or grammar longer than this is refused before compiling


@dataclass(frozen=True)
class GuidedDecodingParams:
    json: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    backend: str | None = None  # vLLM's: None, "auto" or the engine's backend (a setting); another is refused
    whitespace_pattern: str | None = None  # vLLM's: for backends that take one (xgrammar refuses it)

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequestError(
                "guided decoding needs exactly one of json, json_object, regex, choice, grammar; "
                f"got {', '.join(given) if given else 'none'}"
            )
        set_ = object.__setattr__
        if self.json is not None:
            set_(self, "json", _schema_text(self.json))
        if self.choice is not None:
            choice = self.choice
            if (
                not isinstance(choice, (list, tuple))
                or not choice
                or not all(isinstance(c, str) and c for c in choice)
            ):
                raise InvalidRequestError("guided choice must be a non-empty list of non-empty strings")
            set_(self, "choice", tuple(choice))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRequestError(f"guided {name} must be a non-empty string")
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise InvalidRequestError("guided json_object must be true or false")
        text = self.spec
        if isinstance(text, str) and len(text) > MAX_SPEC_CHARS:
            raise InvalidRequestError(
                f"guided {self.kind} is {len(text)} characters; the limit is {MAX_SPEC_CHARS}"
            )

    @property
    def kind(self) -> str:
        """Which of ``KINDS`` this request uses."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def spec(self) -> Any:
        """The value of ``kind``: schema text, regex, grammar, the choices, or True (json_object)."""
        return getattr(self, self.kind)

    @classmethod
    def coerce(cls, value: Any) -> GuidedDecodingParams | None:
        """Params as given, built from a dict of their fields, or None."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise InvalidRequestError(
                    f"unknown guided decoding field {', '.join(unknown)}; "
                    f"valid: {', '.join(cls.__dataclass_fields__)}"
                )
            return cls(**value)
        raise InvalidRequestError(
            f"guided_decoding must be a GuidedDecodingParams or a dict, got {type(value).__name__}"
        )


def _schema_text(schema: Any) -> str:
    """A JSON schema (dict, bool or text) as canonical JSON text; refuses text that is not JSON."""
    if isinstance(schema, str):
        try:
            schema = json_module.loads(schema)
        except ValueError as exc:
            raise InvalidRequestError(f"guided json is not valid JSON: {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequestError(f"guided json must be a JSON schema object, got {type(schema).__name__}")
    try:
        return json_module.dumps(schema, separators=(",", ":"))  # key order kept: it orders the output
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"guided json is not JSON-serialisable: {exc}") from None
