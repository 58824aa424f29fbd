"""The JSON Schemas of request and response bodies: request bodies are validated against them
(matcher.validation) and the OpenAPI document publishes them (matcher.openapi)."""

from __future__ import annotations

from typing import Any

from pilot.protocol import KILL, NO_MATCH_REASONS, PEEK_CHARS, REPORT_TAIL_CHARS
from taskqueue.pilots.pilotreports import REPORTABLE
from taskqueue.pilots.records import PILOT_STATES

Schema = dict[str, Any]


def obj(properties: dict[str, Schema], required: tuple[str, ...] = (), *,
        closed: bool = True) -> Schema:
    out: Schema = {"type": "object", "properties": properties}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    return out


def nullable(schema: Schema) -> Schema:
    kind = schema["type"]
    return {**schema, "type": [*(kind if isinstance(kind, list) else [kind]), "null"]}


STRING: Schema = {"type": "string"}
#: Names as long as their database columns allow.
NAME: Schema = {"type": "string", "minLength": 1, "maxLength": 255}
SHORT_NAME: Schema = {"type": "string", "minLength": 1, "maxLength": 128}
INTEGER: Schema = {"type": "integer"}
#: Counts and sizes within a 32-bit column; CPU seconds within 62 bits (the ClassAd library
#: takes 64-bit integers).
COUNT: Schema = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
SECONDS: Schema = {"type": "integer", "minimum": 0, "maximum": 2**62}
ID: Schema = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
NUMBER: Schema = {"type": "number"}
TIME: Schema = {"type": ["string", "null"], "format": "date-time"}
LABEL: Schema = {"type": "string", "maxLength": 128}
LABELS: Schema = {"oneOf": [LABEL, {"type": "array", "items": LABEL, "maxItems": 1000}]}
STRINGS: Schema = {"type": "array", "items": STRING}

PROBLEM = obj({"type": STRING, "title": STRING, "status": INTEGER, "detail": STRING},
              ("title", "status", "detail"), closed=False)

RESOURCE = obj({
    "vo": {"type": "string", "minLength": 1, "maxLength": 64},
    "pilot_reference": {"type": "string", "maxLength": 255},
    "site": LABELS, "ce": {"type": "string", "maxLength": 255},
    "queue": {"type": "string", "maxLength": 128}, "platform": LABELS, "job_type": LABELS,
    "owner_group": LABELS, "owner": {"type": "string", "maxLength": 255},
    "submit_pools": LABELS, "tags": LABELS, "required_tags": LABELS, "cpu_time": SECONDS,
    "processors": COUNT, "memory": COUNT, "gpus": COUNT,
}, ("vo",), closed=False)

PAYLOAD_TOKEN = obj({"token": STRING, "expires_at": TIME, "scope": STRING},
                    ("token", "expires_at", "scope"))

JOB_PAYLOAD = obj({
    "job_id": ID, "vo": STRING, "owner": STRING, "owner_group": STRING, "job_type": STRING,
    "executable": STRING, "arguments": STRINGS,
    "environment": {"type": "object", "additionalProperties": STRING},
    "cpu_time": COUNT, "processors": COUNT, "memory": COUNT, "gpus": COUNT,
    "input_sandbox": STRINGS, "output_sandbox": STRINGS, "stdout": nullable(STRING),
    "stderr": nullable(STRING),
    "stdin": nullable(STRING), "job_name": nullable(STRING), "description": STRING,
    "description_format": STRING,
    "extra": {"type": "object"},
    # The payload's first token (as the token endpoint answers), when payloads get tokens.
    "token": PAYLOAD_TOKEN,
}, ("job_id", "vo", "owner", "owner_group", "job_type", "executable"))

MATCH_REQUEST = obj({"resource": RESOURCE, "count": {"type": "integer", "minimum": 1}},
                    ("resource",))
MATCH_RESPONSE = obj({
    "jobs": {"type": "array", "items": JOB_PAYLOAD},
    "no_match": {"type": ["object", "null"], "properties": {
        "reason": {"type": "string", "enum": list(NO_MATCH_REASONS)}, "detail": STRING}},
}, ("jobs",))

HEARTBEAT_REQUEST = obj({
    "pilot_reference": NAME,
    "jobs": {"type": "array", "maxItems": 1000, "items": obj({
        "job_id": ID, "cpu_used": {"type": "number", "minimum": 0},
        "progress": {"type": "string", "maxLength": 255},
        "output_tail": {"type": "string", "maxLength": PEEK_CHARS}}, ("job_id",))},
}, ("pilot_reference",))
HEARTBEAT_RESPONSE = obj({"commands": {"type": "array", "items": obj(
    {"job_id": ID, "command": {"type": "string", "enum": [KILL]}}, ("job_id", "command"))},
    "pilot_command": {"type": "string", "enum": [KILL]}}, ("commands",))

STATUS_REPORT = obj({
    "pilot_reference": NAME,
    "status": {"type": "string", "enum": sorted(s.value for s in REPORTABLE)},
    "minor_status": {"type": "string", "maxLength": 255},
    "exit_code": {"type": "integer", "minimum": -255, "maximum": 255},
    "output_tail": {"type": "string", "maxLength": REPORT_TAIL_CHARS},
    "cpu_used": {"type": "number", "minimum": 0},
    "output_sandbox": {"type": "string", "minLength": 1, "maxLength": 80},
}, ("pilot_reference", "status"))
STATUS_ANSWER = obj({"job_id": ID, "status": STRING}, ("job_id", "status"))

PILOT_REGISTRATION = obj({"site": SHORT_NAME, "ce": NAME, "queue": SHORT_NAME,
                          "status": {"type": "string", "enum": list(PILOT_STATES)},
                          "isolation": {
                              "type": "string", "maxLength": 64,
                              "description": "how the pilot isolates its payloads: the tool "
                                             "and its version (\"bwrap 0.8.0\"), or "
                                             "\"none\""}},
                         ("site", "ce", "queue", "status"))
PILOT = obj({"reference": STRING, "vo": STRING, "site": STRING, "ce": STRING, "queue": STRING,
             "status": STRING, "submitted_at": TIME, "last_seen_at": TIME})
PILOT_FIELDS: dict[str, Schema] = {
    "reference": STRING, "vo": STRING, "site": STRING, "ce": STRING, "queue": STRING,
    "status": STRING, "reason": STRING, "executor": nullable(STRING),
    "native_id": nullable(STRING), "submitted_at": TIME, "last_seen_at": TIME,
    "updated_at": TIME, "exit_code": nullable(INTEGER),
    "log": {"type": "string", "enum": ["followed", "stored", "unavailable", "none"],
            "description": "followed: the director still follows the pilot through its CE "
                           "(its log is kept once the CE says it ended); stored: GET "
                           ".../log gives it; unavailable: log_note says why; none: the "
                           "director did not submit it"},
    "log_note": STRING, "kill_requested_by": nullable(STRING),
    "heard_after_end_at": {**TIME, "description": "when the pilot was first heard from "
                           "(match, heartbeat) after its record said it ended; it is told "
                           "to stop"},
    "token_renewals": COUNT, "token_renewed_at": TIME, "token_expires_at": TIME,
    "ce_state": {**STRING, "description": "the CE's own word for the pilot's state as last "
                 "reported (ACCEPTING, QUEUING, HELD ...; empty before its CE said one)"},
    "ce_state_since": {**TIME, "description": "since when the CE has said ce_state"},
    "hung_in": {**nullable(STRING), "description": "the CE state the pilot stayed in past "
                "its timeout, for which it was killed (Submitting: its director never "
                "submitted it)"},
    "isolation": nullable(STRING),
}
PILOT_REFERENCE = obj({"pilot_reference": NAME}, ("pilot_reference",))
OPENID_CONFIGURATION = obj({"issuer": STRING, "jwks_uri": STRING,
                            "id_token_signing_alg_values_supported": STRINGS,
                            "token_endpoint_auth_methods_supported": STRINGS,
                            "claims_supported": STRINGS}, ("issuer", "jwks_uri"))
JWKS = obj({"keys": {"type": "array", "items": {"type": "object"}}}, ("keys",))
PILOT_SUMMARY = obj(PILOT_FIELDS)
PILOT_TOKEN = obj({"token": STRING, "expires_at": TIME, "renewals": COUNT},
                  ("token", "expires_at", "renewals"))
PILOT_LIST = obj({"pilots": {"type": "array", "items": PILOT_SUMMARY},
                  "next_after": nullable(INTEGER)}, ("pilots", "next_after"))
PILOT_RECORD = obj({
    **PILOT_FIELDS,
    "jobs": {"type": "array", "items": obj({"job_id": ID, "status": STRING,
                                            "minor_status": STRING})},
    "last_report": nullable(obj({"job_id": ID, "at": TIME, "status": STRING,
                                 "minor_status": STRING})),
})
#: ``hidden_lines``: lines about other jobs that a user's view of the log leaves out.
PILOT_LOG = obj({"reference": STRING, "status": STRING, "reason": STRING,
                 "exit_code": nullable(INTEGER), "note": STRING, "stdout": STRING,
                 "stderr": STRING, "hidden_lines": INTEGER},
                ("reference", "status", "stdout", "stderr", "hidden_lines"))
SUBMIT_POOLS = obj({"site": STRING, "ce": STRING, "queue": STRING,
                    "submit_pools": STRINGS}, ("submit_pools",))

SUBMIT_JSON: Schema = {"type": ["object", "array"]}
SUBMIT_JDL: Schema = {"type": "string", "minLength": 1}
SUBMITTED = obj({
    "job_ids": {"type": "array", "items": ID},
    "jobs": {"type": "array", "items": obj({"job_id": ID, "status": STRING,
                                            "minor_status": STRING})},
    # Attributes gridpilot does not know (kept for the job), each with the closest known one.
    "warnings": {"type": "array", "items": STRING},
}, ("job_ids", "jobs"))

HISTORY_ENTRY = obj({"at": TIME, "status": STRING, "minor_status": STRING, "source": STRING})
JOB_SUMMARY_FIELDS: dict[str, Schema] = {
    "job_id": ID, "vo": STRING, "owner": STRING, "owner_group": STRING, "status": STRING,
    "minor_status": STRING, "job_type": STRING, "site": nullable(STRING),
    "submitted_at": TIME, "ended_at": TIME, "job_name": nullable(STRING),
    "job_group": nullable(STRING),
}
JOB_SUMMARY = obj(JOB_SUMMARY_FIELDS)
JOB = obj({
    **JOB_SUMMARY_FIELDS, "ce": nullable(STRING), "pilot_reference": nullable(STRING),
    "started_at": TIME, "heartbeat_at": TIME, "reschedule_count": COUNT,
    "cpu_time": COUNT, "processors": COUNT, "memory": COUNT, "user_priority": INTEGER,
    "submit_pool": nullable(STRING), "bulk_index": nullable(INTEGER),
    "cpu_used": nullable(NUMBER), "progress": nullable(STRING), "exit_code": nullable(INTEGER),
    "history": {"type": "array", "items": HISTORY_ENTRY},
})
JOB_LIST = obj({"jobs": {"type": "array", "items": JOB_SUMMARY},
                "next_after": nullable(INTEGER)}, ("jobs", "next_after"))
JOB_COUNTS = obj({"total": COUNT, "by_status": {"type": "object",
                                                "additionalProperties": COUNT}},
                 ("total", "by_status"))
#: Most jobs one bulk request acts on: a client sends more in several requests.
MAX_BULK_JOBS = 1000
BULK_REQUEST = obj({"job_ids": {"type": "array", "items": ID, "minItems": 1,
                                "maxItems": MAX_BULK_JOBS},
                    "reason": {"type": "string", "maxLength": 255}}, ("job_ids",))
BULK_ANSWER = obj({
    "jobs": {"type": "array", "items": obj({"job_id": ID, "status": STRING,
                                            "minor_status": STRING})},
    "errors": {"type": "array", "items": obj({"job_id": ID, "code": INTEGER,
                                              "detail": STRING})},
}, ("jobs", "errors"))
JOB_OUTPUT = obj({"job_id": ID, "status": STRING, "exit_code": nullable(INTEGER),
                  "output_tail": nullable(STRING), "output_sandbox": nullable(STRING),
                  "input_sandboxes": STRINGS})
JOB_STATUS = obj({"job_id": ID, "status": STRING, "minor_status": STRING})
REASON = obj({"reason": {"type": "string", "maxLength": 255}})

TASK_QUEUE = obj({
    "tq_id": ID, "vo": STRING, "owner_group": STRING, "owner": nullable(STRING),
    "cpu_time": COUNT, "processors": COUNT, "memory": COUNT, "gpus": COUNT,
    "job_type": STRING,
    "submit_pool": nullable(STRING), "expression": nullable(STRING), "priority": NUMBER,
    "active": {"type": "boolean"}, "waiting": COUNT, "sites": STRINGS,
    "banned_sites": STRINGS, "platforms": STRINGS, "tags": STRINGS,
    "ces": STRINGS,
})
TASK_QUEUE_LIST = obj({"task_queues": {"type": "array", "items": TASK_QUEUE},
                       "next_after": nullable(INTEGER)}, ("task_queues", "next_after"))
MATCHING_QUEUES = obj({
    "task_queues": {"type": "array", "items": obj({"tq_id": ID, "priority": NUMBER,
                                                   "waiting": COUNT})},
    "waiting": COUNT,
}, ("task_queues", "waiting"))
#: A queue, a resource or neither (every configured queue): never both.
EXPLAIN_REQUEST = {**obj({"job_id": ID, "queue": {"type": "string", "maxLength": 1000},
                          "resource": RESOURCE}, ("job_id",)),
                   "not": {"required": ["queue", "resource"]}}
_RULE = obj({"rule": STRING, "holds": {"type": "boolean"}, "detail": STRING})
#: Against one queue or resource: each rule. Against every configured queue (neither given):
#: each queue with the rules that fail there, and can_run when one of them can run it.
EXPLANATION = obj({
    "job_id": ID, "can_run": {"type": "boolean"},
    "rules": {"type": "array", "items": _RULE},
    "queues": {"type": "array", "items": obj({
        "queue": STRING, "can_run": {"type": "boolean"},
        "failed": {"type": "array", "items": _RULE}})},
}, ("job_id", "can_run", "rules"))

SITE_BAN = obj({"site": STRING, "reason": STRING, "banned_by": STRING, "banned_at": TIME})
SITE_MASK = obj({"banned": {"type": "array", "items": SITE_BAN}}, ("banned",))
DIRECTOR_QUEUE = obj({
    "site": STRING, "ce": STRING, "queue": STRING, "failures": COUNT, "skip_until": TIME,
    "last_error": STRING, "poll_failures": COUNT, "poll_skip_until": TIME,
    "poll_error": STRING, "last_cycle_at": TIME, "retry_requested_at": TIME,
    "retry_requested_by": STRING})
DIRECTOR_QUEUE_LIST = obj({"queues": {"type": "array", "items": DIRECTOR_QUEUE}}, ("queues",))
#: A limit needs a number: max_running, matching_delay or both (null: none).
LIMIT_REQUEST = {**obj({
    "site": SHORT_NAME, "ce": {"type": "string", "maxLength": 255},
    "attribute": {"type": "string", "enum": ["job_type", "owner_group"]}, "value": SHORT_NAME,
    "max_running": nullable({"type": "integer", "minimum": 0, "maximum": 2**31 - 1}),
    "matching_delay": nullable({"type": "integer", "minimum": 0, "maximum": 10**7}),
}, ("site", "attribute", "value")), "anyOf": [
    {"required": [name], "properties": {name: {"type": "integer"}}}
    for name in ("max_running", "matching_delay")]}
LIMIT = obj({
    "limit_id": ID, "site": STRING, "ce": STRING, "attribute": STRING, "value": STRING,
    "max_running": nullable(INTEGER), "matching_delay": nullable(INTEGER),
    "last_matched_at": TIME,
})
LIMIT_LIST = obj({"limits": {"type": "array", "items": LIMIT}}, ("limits",))
SHARE_REQUEST = obj({"share": {"type": "number", "minimum": 1e-9, "maximum": 1e9}},
                    ("share",))
SHARE = obj({"owner_group": STRING, "share": NUMBER,
             "source": {"type": "string", "enum": ["operator", "settings"]}})
SHARE_LIST = obj({"default_share": NUMBER, "shares": {"type": "array", "items": SHARE}},
                 ("default_share", "shares"))
WHOAMI = obj({"subject": STRING, "role": STRING, "vo": STRING, "group": STRING,
              "site": nullable(STRING), "pilot": nullable(STRING), "issuer": STRING,
              "expires_at": TIME, "scopes": nullable({"type": "array", "items": STRING})},
             ("subject", "role", "vo", "group"))
HEALTH = obj({"status": STRING, "database": STRING})

#: The checksum-first upload handshake, and the sandbox it stored.
SANDBOX_REQUEST = obj({
    "checksum": {"type": "string", "minLength": 64, "maxLength": 64,
                 "pattern": "^[0-9a-f]{64}$"},
    "size": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    "job_id": ID,
    "pilot_reference": NAME,
}, ("checksum", "size"))
SANDBOX_UPLOAD = obj({"url": STRING, "method": STRING,
                      "headers": {"type": "object", "additionalProperties": STRING}},
                     ("url", "method"))
SANDBOX_ANSWER = obj({"sandbox_id": STRING, "uploaded": {"type": "boolean"},
                      "upload": nullable(SANDBOX_UPLOAD)}, ("sandbox_id", "uploaded"))
SANDBOX_STORED = obj({"sandbox_id": STRING, "size": COUNT}, ("sandbox_id", "size"))
SANDBOX_USAGE = obj({"vos": {"type": "array", "items": obj(
    {"vo": STRING, "sandboxes": COUNT, "bytes": {"type": "integer", "minimum": 0}})}})

#: The replica catalogue (/api/v1/replicas).
#: Control characters and Unicode white space, spelled out (a generator may read \s as ASCII).
_SPACE_OR_CONTROL = ("\\x00-\\x20\\x7f\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029"
                     "\\u202f\\u205f\\u3000")
#: As taskqueue.files.replicas reads them: an absolute path without spaces, control characters or
#: an empty component (with or without LFN:), and a name of letters, digits and ._:+-.
LFN: Schema = {"type": "string", "minLength": 1, "maxLength": 1024,
               "pattern": "^([Ll][Ff][Nn]:)?((/[^/" + _SPACE_OR_CONTROL + "]+)+/?|/)$",
               "description": "an absolute path in the VO's namespace without spaces or an "
                              "empty component, such as /lhcb/data/run1.dst (with or without "
                              "LFN:)"}
SE_NAME: Schema = {"type": "string", "minLength": 1, "maxLength": 64,
                   "pattern": "^[A-Za-z0-9_.:+-]+$",
                   "description": "a storage element's name of letters, digits and ._:+-"}
REPLICA = obj({"lfn": LFN, "se": SE_NAME, "registered_at": TIME}, ("lfn", "se"))
REPLICAS_ADD = obj({"replicas": {"type": "array", "items": obj({"lfn": LFN, "se": SE_NAME},
                                                                ("lfn", "se")),
                                 "minItems": 1, "maxItems": 10_000}}, ("replicas",))
REPLICAS_REMOVE = obj({"lfns": {"type": "array", "items": LFN, "minItems": 1,
                                "maxItems": 10_000},
                       "se": SE_NAME}, ("lfns",))
REPLICAS_CHANGED = obj({"added": COUNT, "removed": COUNT, "warnings": STRINGS})
REPLICA_LIST = obj({"replicas": {"type": "array", "items": REPLICA}}, ("replicas",))
