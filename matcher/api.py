"""How an endpoint is declared: one decorator registers the Flask route, checks the token's
role, reads and validates the body and the query, and records the operation for the OpenAPI
document, so that what is served and what is documented cannot drift apart."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from flask import Blueprint, Response, current_app, jsonify, request

from matcher.auth import Principal, authorize
from matcher.problems import Problem
from matcher.runtime import Runtime, runtime_of
from matcher.validation import Schema, SchemaError, validate

JSON = "application/json"
JDL = "text/plain"
#: Sandbox archives (tar.gz): read as bytes, never decoded.
ARCHIVE = "application/gzip"


@dataclass(frozen=True)
class Param:
    """A query parameter."""

    name: str
    description: str
    type: str = "string"  # "string" or "integer"
    minimum: int | None = None
    maximum: int | None = None
    enum: tuple[str, ...] | None = None
    required: bool = False
    #: What the OpenAPI document says of the text ("date-time": a time in ISO 8601).
    format: str | None = None
    #: The schema of a text with rules of its own (a pattern), instead of any string.
    text: Schema | None = None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.text) if self.text is not None else {"type": self.type}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.format is not None:
            out["format"] = self.format
        return out


@dataclass(frozen=True)
class Operation:
    """One documented endpoint."""

    method: str
    rule: str  # the Flask rule, under the API prefix
    summary: str
    tag: str
    roles: tuple[str, ...] | None  # None: no token needed
    body: Mapping[str, Schema] | None  # media type -> schema (text bodies: {"type": "string"})
    body_required: bool
    query: tuple[Param, ...]
    responses: Mapping[int, tuple[str, Schema | None]]
    operation_id: str
    #: Statuses whose answer is a sandbox archive, not JSON.
    archive_responses: tuple[int, ...] = ()


#: Every operation declared with :func:`endpoint`, in declaration order.
OPERATIONS: list[Operation] = []


@dataclass
class Call:
    """What a view receives."""

    principal: Principal
    runtime: Runtime
    now: datetime
    #: The body: decoded JSON, and its exact text (a JDL body is text only).
    body: Any = None
    text: str = ""
    media: str | None = None
    query: dict[str, Any] = field(default_factory=dict)


View = Callable[..., Any]


def endpoint(bp: Blueprint, method: str, rule: str, *, summary: str, tag: str,
             roles: tuple[str, ...] | None, responses: Mapping[int, tuple[str, Schema | None]],
             body: Mapping[str, Schema] | None = None, body_required: bool = True,
             query: tuple[Param, ...] = (),
             admit: Callable[[Runtime], bool] | None = None,
             archive_responses: tuple[int, ...] = ()) -> Callable[[View], View]:
    """Declare an endpoint. An optional body (``body_required=False``) may be left out
    altogether; the view then gets ``call.body`` None. ``admit``: a caller it accepts (by
    other means than a token of ``roles``) needs no token."""
    def register(view: View) -> View:
        OPERATIONS.append(Operation(method, f"{bp.url_prefix or ''}{rule}", summary, tag, roles,
                                    body, body_required, query, responses, view.__name__,
                                    archive_responses))

        @functools.wraps(view)
        def handle(**path: Any) -> Response:
            runtime = runtime_of(current_app)
            if roles is None or (admit is not None and admit(runtime)):
                principal = Principal("anonymous", "none", "", "")
            else:
                principal = authorize(request.headers.get("Authorization"), runtime.secret,
                                      runtime.providers, roles, method,
                                      f"{bp.url_prefix or ''}{rule}")
            _check_path(path)
            call = Call(principal, runtime, datetime.now(UTC))
            if body is not None and (body_required or request.content_length
                                     or request.headers.get("Transfer-Encoding")):
                call.media, call.text, call.body = _read_body(body)
            call.query = _read_query(query, runtime.settings.matcher.page_size)
            result = view(call, **path)
            if isinstance(result, Response):
                return result
            payload, status = result if isinstance(result, tuple) else (result, 200)
            return json_response(payload, status)

        bp.add_url_rule(rule, view.__name__, handle, methods=[method])
        return view

    return register


#: How answers are encoded by orjson: dates, times and dataclasses go to Flask's JSON
#: provider as before (its ``default``), keys that are not strings are written as strings.
_ORJSON_OPTIONS = (orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
                   | orjson.OPT_NON_STR_KEYS)


def json_response(payload: Any, status: int = 200) -> Response:
    """``payload`` as a JSON answer. orjson writes it (a fifth of the time Flask's encoder
    takes for a match answer); what orjson cannot write (an integer beyond 64 bits) is left
    to Flask's ``jsonify``, so every answer that was possible still is."""
    try:
        body = orjson.dumps(payload, default=current_app.json.default,  # type: ignore[attr-defined]
                            option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        response = jsonify(payload)
        response.status_code = status
        return response
    return Response(body, status=status, mimetype=JSON)


def _read_body(accepted: Mapping[str, Schema]) -> tuple[str, str, Any]:
    media = (request.mimetype or "").lower()
    if media not in accepted:
        raise Problem(415, f"send the body as {' or '.join(accepted)}"
                      + (f", not {media}" if media else " (no Content-Type was given)"))
    raw = request.get_data(cache=False)
    most = current_app.config.get("MAX_CONTENT_LENGTH")
    if request.content_length is None and most is not None and len(raw) >= most \
            and request.environ["wsgi.input"].read(1):
        # A chunked body is cut at the limit without a word: more after it means too large.
        raise Problem(413, f"the request body is larger than the {most} bytes accepted")
    if media == ARCHIVE:
        return media, "", raw
    limit = runtime_of(current_app).settings.matcher.max_body_bytes
    if len(raw) > limit:
        raise Problem(413, f"the request body is larger than the {limit} bytes accepted")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Problem(400, f"the body is not UTF-8 text (byte {exc.start} is not)") from exc
    value: Any = text
    if media == JSON:
        try:
            value = json.loads(text, parse_constant=_refuse_constant)
        except json.JSONDecodeError as exc:
            raise Problem(400, f"the body is not valid JSON: {exc.msg} at line {exc.lineno} "
                          f"column {exc.colno}") from exc
        except RecursionError as exc:
            raise Problem(400, "the body is not valid JSON: nested too deeply") from exc
        except ValueError as exc:  # a number too long to read, NaN, Infinity
            raise Problem(400, f"the body is not valid JSON: {exc}") from exc
    try:
        validate(value, accepted[media])
    except SchemaError as exc:
        raise Problem(422, str(exc)) from exc
    # JSON can write U+0000 inside a string or key only as the escape \u0000 (a raw control
    # character there is refused by the parser), and a lone surrogate only as an escape
    # \uD800-\uDFFF (the body is valid UTF-8): a text without them holds none to look for.
    if media == JSON and ("\\u0000" in text or _SURROGATE_ESCAPE.search(text)):
        _refuse_nul(value, "body")
    return media, text, value


#: The JSON escape of a surrogate (a lone one, or half of a pair).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
#: A surrogate left alone in a decoded text (a pair becomes one character).
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_nul(value: Any, where: str) -> None:
    """No text may hold U+0000: PostgreSQL cannot store it, and no name or message needs it.
    Nor a lone surrogate, which is no character at all: UTF-8 cannot encode it."""
    if isinstance(value, str):
        if "\x00" in value:
            raise Problem(422, f"{where} contains a NUL character (U+0000)")
        lone = _SURROGATE.search(value)
        if lone is not None:
            raise Problem(400, f"{where} contains a lone surrogate (U+{ord(lone.group()):04X}) "
                          f"at character {lone.start()}, which is not a character: send "
                          f"valid Unicode text")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_nul(key, where)
            _refuse_nul(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_nul(item, f"{where}[{i}]")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


#: Longest value of each text path parameter (the database columns they go to), and the
#: largest id (64-bit keys): longer is refused, larger does not exist.
PATH_TEXT_LIMITS = {"site": 128, "group": 128, "reference": 255, "sandbox_id": 80}
#: Longest text of any other path parameter.
PATH_TEXT_DEFAULT = 1000
MAX_ID = 2**63 - 1


def _check_path(path: dict[str, Any]) -> None:
    for name, value in path.items():
        if isinstance(value, int) and value > MAX_ID:
            raise Problem(404, f"{name.replace('_', ' ')} {value} does not exist")
        limit = PATH_TEXT_LIMITS.get(name, PATH_TEXT_DEFAULT)
        if isinstance(value, str):
            _refuse_nul(value, f"the {name} in the path")
        if isinstance(value, str) and limit is not None and len(value) > limit:
            raise Problem(422, f"the {name} in the path is {len(value)} characters long; at "
                          f"most {limit} are accepted")


def _read_query(params: tuple[Param, ...], page_size: int) -> dict[str, Any]:
    if not params and not request.query_string:  # the usual pilot request: nothing to read
        return {}
    known = {p.name: p for p in params}
    unknown = sorted(set(request.args) - set(known))
    if unknown:
        raise Problem(400, f"unknown query parameter {unknown[0]!r}"
                      + (f" (known: {', '.join(sorted(known))})" if known else ""))
    values: dict[str, Any] = {}
    for name, param in known.items():
        text = request.args.get(name)
        if text is None:
            if param.required:
                raise Problem(400, f"query parameter {name} is required: {param.description}")
            continue
        value: Any = text
        _refuse_nul(text, f"query parameter {name}")
        if param.enum is not None:  # names in any letter case: ?status=waiting
            value = {e.lower(): e for e in param.enum}.get(text.lower(), text)
        if param.type == "integer":
            if not re.fullmatch(r"-?\d{1,19}", text.strip()):
                raise Problem(400, f"query parameter {name} must be an integer, got {text!r}")
            value = int(text)
            if not -(2**63) <= value < 2**63:
                raise Problem(400, f"query parameter {name} must be at most {2**63 - 1}, "
                              f"got {text!r}")
        try:
            validate(value, param.schema(), f"query parameter {name}")
        except SchemaError as exc:
            raise Problem(400, str(exc)) from exc
        values[name] = value
    if "limit" in known:
        values.setdefault("limit", page_size)
    return values
