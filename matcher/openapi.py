"""The OpenAPI 3 document, built from the operations the endpoints declared (matcher.api)."""

from __future__ import annotations

import re
from typing import Any

from flask import Flask

from matcher import schemas
from matcher.api import (
    JSON,
    OPERATIONS,
    PATH_TEXT_DEFAULT,
    PATH_TEXT_LIMITS,
    Operation,
    Param,
)
from matcher.runtime import runtime_of

#: Problems every endpoint may answer with, besides its own.
_COMMON = {400: "Malformed request: bad JSON, an unknown or malformed query parameter",
           413: "The body is larger than the service accepts",
           414: "The URL is longer than the service accepts",
           415: "The body's media type is not one this endpoint reads",
           422: "The body is well-formed but wrong: the detail names the field"}
_AUTH = {401: "No token, or a token that is not valid or has expired",
         403: "The token's role, VO, site or pilot may not do this"}
#: The pattern of a text that holds no U+0000.
NO_NUL = "^[^\\u0000]*$"
_RULE_PARAM = re.compile(r"<(?:(\w+):)?(\w+)>")


def openapi_path(rule: str) -> str:
    """A Flask rule in OpenAPI's notation: ``/jobs/<int:job_id>`` → ``/jobs/{job_id}``."""
    return _RULE_PARAM.sub(r"{\2}", rule)


def document(app: Flask, server: str = "/") -> dict[str, Any]:
    """The OpenAPI document of ``app``'s operations, served at ``server`` (the service's URL
    as its client sees it)."""
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(openapi_path(op.rule), {})[op.method.lower()] = _operation(op)
    # The largest upload this service takes ([sandboxes] max_upload_bytes; larger: 413).
    upload = paths["/api/v1/sandboxes"]["post"]["requestBody"]["content"][JSON]["schema"]
    upload["properties"]["size"]["maximum"] = runtime_of(app).settings.sandboxes.max_upload_bytes
    paths["/api/v1/openapi.json"] = {"get": {
        "operationId": "openapi", "summary": "This document (no token needed)",
        "tags": ["service"], "security": [],
        "responses": {"200": {"description": "The OpenAPI document",
                              "content": {"application/json": {"schema": {"type": "object"}}}}},
    }}
    return {
        "openapi": "3.0.3",
        "info": {"title": "gridpilot matcher", "version": "1",
                 "description": "Jobs, pilots and task queues of a grid workload management "
                                "system. Every error is application/problem+json."},
        "servers": [{"url": server}],
        "security": [{"bearer": []}],
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "bearerFormat": "JWT"}},
                       "schemas": {"Problem": _openapi_schema(schemas.PROBLEM)}},
        "paths": paths,
    }


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary,
                           "tags": [op.tag]}
    if op.roles is None:
        out["security"] = []
    else:
        out["description"] = f"Roles allowed: {', '.join(op.roles)}."
    params: list[dict[str, Any]] = []
    for kind, name in _RULE_PARAM.findall(op.rule):
        params.append({"name": name, "in": "path", "required": True,
                       "schema": {"type": "integer", "minimum": 0} if kind == "int"
                       else {"type": "string", "minLength": 1,
                             "maxLength": PATH_TEXT_LIMITS.get(name, PATH_TEXT_DEFAULT),
                             "pattern": NO_NUL}})
    for p in op.query:
        params.append({"name": p.name, "in": "query", "required": p.required,
                       "description": p.description, "schema": _query_schema(p)})
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {"required": op.body_required, "content": {
            media: {"schema": _no_nul(_openapi_schema(schema)) if media == JSON
                    else _openapi_schema(schema)} for media, schema in op.body.items()}}
    responses: dict[str, Any] = {}
    for status, (description, schema) in op.responses.items():
        if status in op.archive_responses:
            responses[str(status)] = {"description": description, "content": {
                "application/gzip": {"schema": {"type": "string", "format": "binary"}}}}
            continue
        media = "application/problem+json" if status >= 400 else (
            "application/json" if schema is not None else "text/plain")
        responses[str(status)] = {"description": description, "content": {
            media: {"schema": _openapi_schema(schema) if schema is not None
                    else {"type": "string"}}}}
    extra = dict(_COMMON)
    if op.roles is not None:
        extra.update(_AUTH)
    if "<" in op.rule:
        extra[404] = "No such object"
    if op.method != "GET":
        extra[409] = "The change conflicts with the object's state (e.g. a job already ended)"
    for status, description in extra.items():
        responses.setdefault(str(status), {"description": description, "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}})
    out["responses"] = responses
    return out


def _query_schema(param: Param) -> dict[str, Any]:
    """A query parameter's schema as the service reads it: a text holds no U+0000, and an
    integer fits in 64 bits."""
    schema: dict[str, Any] = _no_nul(param.schema())
    if param.type == "integer":
        schema.setdefault("minimum", -(2**63))
        schema.setdefault("maximum", 2**63 - 1)
    return schema


def _no_nul(schema: Any) -> Any:
    """``schema`` with every free text refusing U+0000, as the service does (PostgreSQL
    cannot store it)."""
    if isinstance(schema, list):
        return [_no_nul(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _no_nul(v) if k in ("items", "oneOf", "additionalProperties") else v
           for k, v in schema.items()}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {name: _no_nul(v) for name, v in out["properties"].items()}
    if out.get("type") == "string" and not {"pattern", "enum", "format"} & set(out):
        out["pattern"] = NO_NUL
    return out


def _openapi_schema(schema: Any) -> Any:
    """Our JSON Schema in OpenAPI 3.0's dialect: a type list with "null" becomes nullable."""
    if isinstance(schema, list):
        return [_openapi_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _openapi_schema(v) for k, v in schema.items()}
    kind = out.get("type")
    if isinstance(kind, list):
        nullable = "null" in kind
        kinds = [k for k in kind if k != "null"]
        out.pop("type")
        if len(kinds) == 1:
            out["type"] = kinds[0]
        else:
            out = {"oneOf": [{**out, "type": k} for k in kinds]}
        if nullable:
            out["nullable"] = True
    if "properties" in out:
        out["properties"] = {k: _openapi_schema(v) for k, v in schema["properties"].items()}
    return out
