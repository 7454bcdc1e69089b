"""A request body's structured output (``response_format``, ``guided_json`` / ``_regex`` / ``_choice`` /
``_grammar``) as the engine's ``GuidedDecodingParams``; the server and batch files share it."""

from __future__ import annotations

from hetero_core.engine.requests.guided import GuidedDecodingParams
from hetero_core.errors import InvalidRequestError
from hetero_core.openai_api.protocol import GuidedFields

GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def guided_decoding(body: GuidedFields) -> GuidedDecodingParams | None:
    """What the body asks its output to be, or None (free text); at most one way may be given."""
    asked = {field: kind for field, kind in GUIDED.items() if getattr(body, field) is not None}
    fmt = body.response_format
    if fmt is not None and fmt.type != "text":
        asked["response_format"] = fmt.type
    if len(asked) > 1:
        raise InvalidRequestError(
            f"give at most one of response_format, {', '.join(GUIDED)}; got {', '.join(asked)}"
        )
    if not asked:
        return None
    field = next(iter(asked))
    if field != "response_format":
        return GuidedDecodingParams(**{GUIDED[field]: getattr(body, field)})
    if fmt.type == "json_object":
        return GuidedDecodingParams(json_object=True)
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise InvalidRequestError(
            "response_format of type json_schema needs json_schema.schema (a JSON schema)"
        )
    return GuidedDecodingParams(json=fmt.json_schema.schema_)
