"""Request bodies checked against the same JSON Schemas the OpenAPI document publishes.

A small, strict subset of JSON Schema (type, properties, required, additionalProperties,
items, enum, minimum, maximum, minLength, maxLength, minItems, maxItems, oneOf of types):
enough for our schemas, and every error names the path of the offending value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

Schema = Mapping[str, Any]

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "integer": (int,),
    "number": (int, float), "boolean": (bool,), "null": (type(None),),
}


class SchemaError(ValueError):
    """A value does not fit its schema; the message names where."""


def validate(value: Any, schema: Schema, where: str = "body") -> None:
    """Raise :class:`SchemaError` unless ``value`` fits ``schema``."""
    if "oneOf" in schema:
        for option in schema["oneOf"]:
            try:
                validate(value, option, where)
                return
            except SchemaError:
                continue
        raise SchemaError(f"{where} has the wrong type: {_describe(value)} fits none of "
                          f"{', '.join(_expected(o) for o in schema['oneOf'])}")
    expected = schema.get("type")
    if expected is not None and not _is(value, expected):
        raise SchemaError(f"{where} must be {_article(expected)}, got {_describe(value)}")
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaError(f"{where} must be one of {', '.join(map(str, schema['enum']))}, "
                          f"got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaError(f"{where} must be at least {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            raise SchemaError(f"{where} must be at most {schema['maximum']}, got {value}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise SchemaError(f"{where} must not be empty" if schema["minLength"] == 1 else
                              f"{where} must be at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise SchemaError(f"{where} must be at most {schema['maxLength']} characters long")
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            shown = value if len(value) <= 80 else value[:77] + "..."
            raise SchemaError(f"{where} must be {schema['description']}, got {shown!r}"
                              if "description" in schema else
                              f"{where} must match {schema['pattern']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            raise SchemaError(f"{where} must hold at least {schema['minItems']} item"
                              + ("s" if schema["minItems"] > 1 else ""))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise SchemaError(f"{where} may hold at most {schema['maxItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                validate(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        properties: Mapping[str, Schema] = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                raise SchemaError(f"{where}.{name} is required")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                validate(item, properties[name], f"{where}.{name}")
            elif extra is False:
                raise SchemaError(f"{where}.{name} is not a known field (known: "
                                  f"{', '.join(sorted(properties))})")
            elif isinstance(extra, Mapping):
                validate(item, extra, f"{where}.{name}")


def _is(value: Any, expected: str | list[str]) -> bool:
    names = [expected] if isinstance(expected, str) else expected
    for name in names:
        if name in ("integer", "number") and isinstance(value, bool):
            continue
        if isinstance(value, _TYPES[name]):
            return True
    return False


def _expected(schema: Schema) -> str:
    return str(schema.get("type", "a value"))


def _article(expected: str | list[str]) -> str:
    if isinstance(expected, list):
        return " or ".join(_article(e) for e in expected)
    return {"object": "an object", "array": "a list", "integer": "an integer",
            "null": "null"}.get(expected, f"a {expected}")


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)
