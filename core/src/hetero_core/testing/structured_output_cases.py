"""The schemas, regexes and choices every structured-output backend must honour, and a small JSON-schema
checker for the keywords they use (type, properties, required, additionalProperties, enum, const,
items, minItems, maxItems, minimum, maximum, anyOf, minLength, maxLength), so the kit needs no jsonschema.
"""

from __future__ import annotations

from typing import Any

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "flat object": PERSON,
    "nested objects": {
        "type": "object",
        "properties": {
            "owner": PERSON,
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 16},
                    "zip": {"type": "string", "maxLength": 8},
                },
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["owner", "address"],
        "additionalProperties": False,
    },
    "enum and const": {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "kind": {"const": "paint"},
            "size": {"enum": [1, 2, 3]},
        },
        "required": ["colour", "kind", "size"],
        "additionalProperties": False,
    },
    "arrays": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 8},
                "minItems": 1,
                "maxItems": 3,
            },
            "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 4},
        },
        "required": ["tags", "scores"],
        "additionalProperties": False,
    },
    "numbers and booleans": {
        "type": "object",
        "properties": {
            "price": {"type": "number", "minimum": 0, "maximum": 1000},
            "count": {"type": "integer"},
            "in_stock": {"type": "boolean"},
            "note": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}]},
        },
        "required": ["price", "count", "in_stock", "note"],
        "additionalProperties": False,
    },
    "array of objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
            "required": ["id", "ok"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
}
REGEXES = {
    "date": r"\d{4}-\d{2}-\d{2}",
    "word list": r"[a-z]{1,8}(, [a-z]{1,8}){0,3}",
    "phone": r"\+\d{2} \d{3}",
}
CHOICES = {"sentiment": ["positive", "negative", "neutral"], "yes or no": ["yes", "no"]}

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def schema_problems(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Why ``value`` does not match ``schema`` (empty when it does), for the keywords above."""
    if "anyOf" in schema:
        if all(schema_problems(value, s, path) for s in schema["anyOf"]):
            return [f"{path}: matches none of anyOf"]
        return []
    problems = []
    kind = schema.get("type")
    if kind == "integer" and not (isinstance(value, int) and not isinstance(value, bool)):
        return [f"{path}: {value!r} is not an integer"]
    if kind == "number" and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return [f"{path}: {value!r} is not a number"]
    if kind in _TYPES and not isinstance(value, _TYPES[kind]):
        return [f"{path}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} not in {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        problems.append(f"{path}: {value!r} != {schema['const']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{path}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{path}: {value} > maximum {schema['maximum']}")
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)) or len(value) < schema.get("minLength", 0):
            problems.append(f"{path}: string length {len(value)} outside its bounds")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        problems += [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if key in properties:
                problems += schema_problems(item, properties[key], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                problems.append(f"{path}: unexpected property {key!r}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            problems.append(f"{path}: {len(value)} items outside its bounds")
        for i, item in enumerate(value):
            problems += schema_problems(item, schema.get("items", {}), f"{path}[{i}]")
    return problems
