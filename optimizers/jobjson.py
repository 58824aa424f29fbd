"""Reading job descriptions written as JSON, with PSI/J's JobSpec names where they exist.

    {"executable": "/bin/sh", "arguments": ["-c", "echo hi"], "environment": {"A": "1"},
     "directory": "work", "stdout_path": "out.txt", "stderr_path": "err.txt",
     "name": "hello", "input_sandbox": ["data.txt"], "output_sandbox": ["out.txt"],
     "resources": {"process_count": 1, "cpu_cores_per_process": 4, "memory": 4294967296},
     "attributes": {"duration": 3600, "queue_name": "long",
                    "custom_attributes": {"JobType": "User", "Priority": 3, "Site": [...],
                                          "Requirements": {"SoftwareTag": [...]}}}}

``resources.memory`` is in bytes, as in PSI/J (rounded up to whole MB); ``attributes.duration``
is the CPU time in seconds; processors = process_count times cpu_cores_per_process. Every JDL field
without a PSI/J name goes in ``custom_attributes`` under its JDL name; a string ``Requirements``
there is a ClassAd expression, an object is an RFC 7 requirements section.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from optimizers.description import (
    MAX_DESCRIPTION_BYTES,
    Expression,
    JobDescription,
    JobDescriptionError,
    JSONValue,
    Raw,
    build_descriptions,
    canonical_name,
)

#: JSON key → JDL field.
TOP_LEVEL = {
    "executable": "Executable", "arguments": "Arguments", "environment": "Environment",
    "directory": "Directory", "stdout_path": "StdOutput", "stderr_path": "StdError",
    "name": "JobName", "input_sandbox": "InputSandbox", "output_sandbox": "OutputSandbox",
}
_IGNORED_PSIJ = {"inherit_environment", "stdin_path", "pre_launch", "post_launch", "launcher"}
MB = 1024 * 1024


def parse_json_text(text: str) -> list[JobDescription]:
    """The jobs a JSON text describes (one object, or a list of objects)."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_DESCRIPTION_BYTES:
        raise JobDescriptionError(
            f"the JSON description is {size} bytes long; at most {MAX_DESCRIPTION_BYTES} are "
            "accepted")
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise JobDescriptionError(
            f"the JSON description is not valid JSON: {exc.msg} at line {exc.lineno}, "
            f"column {exc.colno}") from exc
    except ValueError as exc:
        raise JobDescriptionError(f"the JSON description is not valid JSON: {exc}") from exc
    if isinstance(data, list):
        jobs: list[JobDescription] = []
        for i, item in enumerate(data):
            try:
                jobs.extend(parse_json(item))
            except JobDescriptionError as exc:
                raise JobDescriptionError(f"job {i}: {exc.message}", exc.field) from exc
        return jobs
    return parse_json(data)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(data: Any) -> list[JobDescription]:
    """The jobs a decoded JSON object describes."""
    if not isinstance(data, Mapping):
        raise JobDescriptionError(
            f"a JSON job description must be an object, got {type(data).__name__}")
    raw: Raw = {}
    extra: dict[str, JSONValue] = {}
    for key, value in data.items():
        if key in TOP_LEVEL:
            raw[TOP_LEVEL[key]] = (key, value)
        elif key == "resources":
            _resources(value, raw)
        elif key == "attributes":
            _attributes(value, raw, extra)
        elif key in _IGNORED_PSIJ:
            extra[key] = value
        else:
            raise JobDescriptionError(
                f"{key} is not a job description field; put fields of your own in "
                "attributes.custom_attributes", key)
    return build_descriptions(raw, extra)


def _object(value: Any, label: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise JobDescriptionError(f"{label} must be an object, got {json.dumps(value)}", label)
    return value


def _resources(value: Any, raw: Raw) -> None:
    res = _object(value, "resources")
    known = {"process_count", "cpu_cores_per_process", "memory", "node_count",
             "processes_per_node", "gpu_cores_per_process", "exclusive_node_use"}
    for key in res:
        if key not in known:
            raise JobDescriptionError(f"resources.{key} is not a PSI/J resource field",
                                      f"resources.{key}")
    if "process_count" in res or "cpu_cores_per_process" in res:
        processes = _positive_int(res.get("process_count", 1), "resources.process_count")
        cores = _positive_int(res.get("cpu_cores_per_process", 1),
                              "resources.cpu_cores_per_process")
        label = ("resources.process_count" if "process_count" in res
                 else "resources.cpu_cores_per_process")
        raw["NumberOfProcessors"] = (label, processes * cores)
    if "memory" in res:
        memory = res["memory"]
        if isinstance(memory, bool) or not isinstance(memory, int | float) or memory < 0 or (
                isinstance(memory, float) and not math.isfinite(memory)):
            raise JobDescriptionError(
                f"resources.memory must be a non-negative number of bytes, got "
                f"{json.dumps(memory)}", "resources.memory")
        raw["MaxRAM"] = ("resources.memory", math.ceil(memory / MB))


def _attributes(value: Any, raw: Raw, extra: dict[str, JSONValue]) -> None:
    attrs = _object(value, "attributes")
    for key, item in attrs.items():
        if key == "duration":
            raw["CPUTime"] = ("attributes.duration", item)
        elif key == "queue_name":
            extra["queue_name"] = item
        elif key == "custom_attributes":
            _custom(item, raw, extra)
        elif key in {"account", "project_name", "reservation_id"}:
            extra[key] = item
        else:
            raise JobDescriptionError(f"attributes.{key} is not a PSI/J job attribute",
                                      f"attributes.{key}")


def _custom(value: Any, raw: Raw, extra: dict[str, JSONValue]) -> None:
    custom = _object(value, "attributes.custom_attributes")
    for key, item in custom.items():
        label = f"attributes.custom_attributes.{key}"
        name = canonical_name(key)
        if name is None:
            extra[key] = item
            continue
        if name in raw:
            raise JobDescriptionError(f"{label} repeats {raw[name][0]}; give it once", label)
        if name == "Requirements" and isinstance(item, str):
            item = Expression(item)
        raw[name] = (label, item)


def _positive_int(value: Any, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobDescriptionError(f"{label} must be a positive integer, got {json.dumps(value)}",
                                  label)
    return value
