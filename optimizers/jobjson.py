"""Reading job descriptions written as JSON, with PSI/J's JobSpec names where they exist.

    {"executable": "/bin/sh", "arguments": ["-c", "echo hi"], "environment": {"A": "1"},
     "directory": "work", "stdin_path": "in.txt", "stdout_path": "out.txt",
     "stderr_path": "err.txt",
     "name": "hello", "input_sandbox": ["data.txt"], "output_sandbox": ["out.txt"],
     "resources": {"process_count": 1, "cpu_cores_per_process": 4, "memory": 4294967296},
     "attributes": {"duration": 3600, "queue_name": "long",
                    "custom_attributes": {"JobType": "User", "Priority": 3, "Site": [...],
                                          "Requirements": {"SoftwareTag": [...]}}}}

A text holds one such object, or a non-empty list of them (at most MAX_PARAMETRIC_JOBS jobs in
all, counting each parameter of a parametric job).

``resources.memory`` is in bytes, as in PSI/J (rounded up to whole MB); ``attributes.duration``
is the CPU time in seconds; processors = processes times ``cpu_cores_per_process``, where the
processes are ``process_count`` or, on the one node, ``processes_per_node`` (both: they must
agree). Jobs run on one node: a ``node_count`` above 1, or processes that need more than one
node, are refused. ``gpu_cores_per_process`` is the GPUs each process needs: the job's
NumberOfGPUs is the processes times that (a pilot offers GPUs by count, and hands each payload
its own devices). ``exclusive_node_use`` is kept with the job's extra fields for the payload:
a pilot runs in the slot it was given and cannot reserve a whole node, yet PSI/J sets it to
true by default, so refusing it would refuse most JobSpecs written by PSI/J.

Every JDL field without a PSI/J name goes in ``custom_attributes`` under its JDL name; a string
``Requirements`` there is a ClassAd expression (stored re-printed canonically, as the JDL
parser stores it), an object is an RFC 7 requirements section, ``true`` means no requirement
and ``false`` is refused.

A field may be given only once, whichever way it is spelled (``executable`` and
``custom_attributes.Executable``, ``attributes.duration`` and ``custom_attributes.CPUTime``,
or the same key twice in one object). Before any field is read, the decoded value is checked
for what ``json`` lets through but nothing after it should meet: numbers that are too large,
nesting deeper than MAX_DEPTH, and strings (keys too) holding a lone surrogate, which cannot
be encoded as UTF-8, or a NUL character, which the JDL form refuses as well.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from optimizers.classads import canonical_expression
from optimizers.description import (
    MAX_DESCRIPTION_BYTES,
    MAX_PARAMETRIC_JOBS,
    Expression,
    JobDescription,
    JobDescriptionError,
    Raw,
    build_descriptions,
    canonical_name,
)

#: JSON key → JDL field.
TOP_LEVEL = {
    "executable": "Executable", "arguments": "Arguments", "environment": "Environment",
    "directory": "Directory", "stdin_path": "StdInput", "stdout_path": "StdOutput",
    "stderr_path": "StdError",
    "name": "JobName", "input_sandbox": "InputSandbox", "output_sandbox": "OutputSandbox",
}
_IGNORED_PSIJ = {"inherit_environment", "pre_launch", "post_launch", "launcher"}
_RESOURCES = ("node_count", "process_count", "processes_per_node", "cpu_cores_per_process",
              "gpu_cores_per_process", "memory", "exclusive_node_use")
MB = 1024 * 1024
#: Deepest nesting of objects and lists accepted in one job. A description needs about five
#: levels; the cap keeps every later step that walks a value (validation, parametric
#: substitution, printing it in a message) far from Python's recursion limit.
MAX_DEPTH = 32
#: Longest integer accepted, in digits: Python's default limit for turning text into an int.
MAX_INT_DIGITS = 4300
_TOO_DEEP = (f"the JSON description is nested too deeply: at most {MAX_DEPTH} levels of objects "
             "and lists are accepted")


def parse_json_text(text: str) -> list[JobDescription]:
    """The jobs a JSON text describes (one object, or a non-empty list of objects)."""
    return [job for _text, jobs in parse_json_bulk(text) for job in jobs]


def parse_json_bulk(text: str) -> list[tuple[str, list[JobDescription]]]:
    """Each job object of a JSON text with the jobs it describes: one object keeps ``text``
    as its own text, each object of a list gets its own (compact) JSON text, so that a job
    stored from a bulk holds its own description, not the whole list."""
    if not isinstance(text, str):
        raise JobDescriptionError(f"a JSON description must be text, got {type(text).__name__}")
    try:
        size, encodable = len(text.encode("utf-8")), True
    except UnicodeEncodeError:
        size, encodable = len(text.encode("utf-8", errors="replace")), False
    if size > MAX_DESCRIPTION_BYTES:
        raise JobDescriptionError(
            f"the JSON description is {size} bytes long; at most {MAX_DESCRIPTION_BYTES} are "
            "accepted")
    data = _decode(text)
    # Without a \u escape the decoder can make no lone surrogate and no NUL (raw control
    # characters are refused in its strings), and the text itself holds no surrogate: none of
    # its strings needs looking at again.
    texts = not encodable or "\\u" in text
    if not isinstance(data, list):
        return [(text, parse_json(data, texts=texts))]
    if not data:
        raise JobDescriptionError("the JSON description is an empty list: it holds no job")
    parts: list[tuple[str, list[JobDescription]]] = []
    total = 0
    for i, item in enumerate(data):
        try:
            jobs = parse_json(item, texts=texts)
        except JobDescriptionError as exc:
            raise JobDescriptionError(f"job {i}: {exc.message}", exc.field) from exc
        total += len(jobs)
        # Checked as the list is read: each job may expand to MAX_PARAMETRIC_JOBS jobs, and a
        # list of such jobs would otherwise build millions of descriptions before being refused.
        if total > MAX_PARAMETRIC_JOBS:
            raise JobDescriptionError(
                f"the JSON description holds more than {MAX_PARAMETRIC_JOBS} jobs (counting "
                f"each parameter of a parametric job); at most {MAX_PARAMETRIC_JOBS} jobs can "
                "be submitted at once")
        parts.append((_compact(item), jobs))
    return parts


def _compact(item: Any) -> str:
    """A job object of a list as its own compact JSON text (orjson's, a twentieth of the time
    of the standard library's; an integer beyond 64 bits, which orjson refuses, by the
    standard library's)."""
    try:
        return orjson.dumps(item).decode()
    except orjson.JSONEncodeError:
        return json.dumps(item, ensure_ascii=False, separators=(",", ":"))


class _Refused(ValueError):
    """A value the decoder's hooks refuse; its text is the whole message for the user."""


class _RepeatedKey(dict[str, Any]):
    """A decoded object in which ``key`` appears more than once.

    The decoder keeps only the last value of a repeated key, silently; the hook cannot say
    where the object is, so it marks it and _check_values refuses it with its place.
    """

    def __init__(self, pairs: Iterable[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


def _decode(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_int=_integer,
                          parse_float=_float, object_pairs_hook=_object)
    except _Refused as exc:
        raise JobDescriptionError(str(exc)) from exc
    except json.JSONDecodeError as exc:
        raise JobDescriptionError(
            f"the JSON description is not valid JSON: {exc.msg} at line {exc.lineno}, "
            f"column {exc.colno}") from exc
    except RecursionError as exc:
        raise JobDescriptionError(_TOO_DEEP) from exc
    except ValueError as exc:
        raise JobDescriptionError(f"the JSON description is not valid JSON: {exc}") from exc
    except Exception as exc:  # whatever else the decoder raises is still a bad description
        raise JobDescriptionError(f"the JSON description cannot be read: {exc}") from exc


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _integer(text: str) -> int:
    # Python refuses longer ones itself, with advice about sys.set_int_max_str_digits that
    # means nothing to the person who wrote the description.
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"the JSON description holds an integer of {digits} digits; at most "
                       f"{MAX_INT_DIGITS} digits are accepted")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 would become infinity
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise _Refused(f"the JSON description holds the number {shown}, which is too large")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _RepeatedKey(pairs, key)
        seen.add(key)
    return dict(pairs)


def parse_json(data: Any, *, texts: bool = True) -> list[JobDescription]:
    """The jobs a decoded JSON object describes. ``texts=False``: its strings are known to
    hold no lone surrogate and no NUL, and are not checked again."""
    if not isinstance(data, Mapping):
        raise JobDescriptionError(
            f"a JSON job description must be an object, got {_kind(data)}")
    _check_values(data, texts=texts)
    raw: Raw = {}
    extra: Raw = {}  # fields for the payload, with their labels to refuse repeats
    for key, value in data.items():
        if key in TOP_LEVEL:
            _put(raw, TOP_LEVEL[key], key, value)
        elif key == "resources":
            _resources(value, raw, extra)
        elif key == "attributes":
            _attributes(value, raw, extra)
        elif key in _IGNORED_PSIJ:
            _put(extra, key, key, value)
        else:
            raise JobDescriptionError(
                f"{key} is not a job description field; put fields of your own in "
                "attributes.custom_attributes", key)
    if "Executable" not in raw:
        # Checked here rather than left to build_descriptions, which names the JDL field.
        raise JobDescriptionError("executable is required: the program the job runs",
                                  "executable")
    return build_descriptions(raw, {key: value for key, (_, value) in extra.items()})


def _put(fields: Raw, name: str, label: str, value: Any) -> None:
    """Set a field, refusing a second value for it however it was spelled."""
    if name in fields:
        raise JobDescriptionError(f"{label} repeats {fields[name][0]}; give it once", label)
    fields[name] = (label, value)


def _check_values(job: Mapping[str, Any], *, texts: bool = True) -> None:
    """Refuse a repeated key, deep nesting, and (unless ``texts`` is False) strings no later
    step can handle.

    Iterative, so that it cannot itself run out of stack on the nesting it refuses.
    """
    stack: list[tuple[Any, str, int]] = [(job, "", 1)]
    while stack:
        value, label, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value, label, label)
            continue
        if not isinstance(value, Mapping | list):
            continue
        if depth > MAX_DEPTH:
            raise JobDescriptionError(
                f"{label or 'the job description'} is nested too deeply: at most {MAX_DEPTH} "
                "levels of objects and lists are accepted", label or None)
        if isinstance(value, _RepeatedKey):
            where = _join(label, value.key)
            raise JobDescriptionError(f"{where} is given twice; give it once", where)
        children: list[tuple[Any, str, int]] = []
        if isinstance(value, Mapping):
            for key, item in value.items():
                name = key if isinstance(key, str) else str(key)
                if texts:
                    what = f"a key in {label}" if label else "a key of the job description"
                    _check_text(name, what, label or None)
                elif not isinstance(item, Mapping | list):
                    continue
                children.append((item, _join(label, name), depth + 1))
        else:
            children = [(item, label, depth + 1) for item in value
                        if texts or isinstance(item, Mapping | list)]
        stack.extend(reversed(children))  # report the first problem in the text's order


def _check_text(text: str, what: str, field: str | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise JobDescriptionError(
            f"{what} contains a character that is not valid Unicode (a lone surrogate)",
            field) from exc
    if "\x00" in text:
        raise JobDescriptionError(f"{what} contains a NUL character", field)


def _join(label: str, key: str) -> str:
    return f"{label}.{key}" if label else key


def _mapping(value: Any, label: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise JobDescriptionError(f"{label} must be an object, got {_shown(value)}", label)
    return value


def _resources(value: Any, raw: Raw, extra: Raw) -> None:
    """Fill in the processors, memory and GPUs."""
    res = _mapping(value, "resources")
    for key in res:
        if key not in _RESOURCES:
            raise JobDescriptionError(f"resources.{key} is not a PSI/J resource field",
                                      f"resources.{key}")
    given = {key: _positive_int(res[key], f"resources.{key}")
             for key in ("node_count", "process_count", "processes_per_node",
                         "cpu_cores_per_process") if key in res}
    if given.get("node_count", 1) > 1:
        raise JobDescriptionError(
            f"multi-node jobs are not supported: resources.node_count must be 1, got "
            f"{given['node_count']}; ask for processes on one node with resources.process_count",
            "resources.node_count")
    processes = given.get("process_count", given.get("processes_per_node", 1))
    per_node = given.get("processes_per_node", processes)
    if processes > per_node:
        raise JobDescriptionError(
            f"multi-node jobs are not supported: resources.process_count ({processes}) with "
            f"resources.processes_per_node ({per_node}) needs more than one node",
            "resources.processes_per_node")
    if per_node > processes:
        raise JobDescriptionError(
            f"resources.processes_per_node ({per_node}) cannot be more than "
            f"resources.process_count ({processes}): jobs run on one node",
            "resources.processes_per_node")
    counts = [key for key in ("process_count", "processes_per_node", "cpu_cores_per_process")
              if key in given]
    if counts:
        cores = given.get("cpu_cores_per_process", 1)
        _put(raw, "NumberOfProcessors", f"resources.{counts[0]}", processes * cores)
    if "memory" in res:
        memory = res["memory"]
        if isinstance(memory, bool) or not isinstance(memory, int | float) or memory < 0 or (
                isinstance(memory, float) and not math.isfinite(memory)):
            raise JobDescriptionError(
                f"resources.memory must be a non-negative number of bytes, got "
                f"{_shown(memory)}", "resources.memory")
        # Integer division for integers: a float quotient overflows for very large ones.
        mb = -(-memory // MB) if isinstance(memory, int) else math.ceil(memory / MB)
        _put(raw, "MaxRAM", "resources.memory", mb)
    if "exclusive_node_use" in res:
        exclusive = res["exclusive_node_use"]
        if not isinstance(exclusive, bool):
            raise JobDescriptionError(
                f"resources.exclusive_node_use must be true or false, got {_shown(exclusive)}",
                "resources.exclusive_node_use")
        _put(extra, "exclusive_node_use", "resources.exclusive_node_use", exclusive)
    if "gpu_cores_per_process" not in res:
        return
    label = "resources.gpu_cores_per_process"
    gpus = res["gpu_cores_per_process"]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise JobDescriptionError(
            f"{label} must be a non-negative integer, got {_shown(gpus)}", label)
    if gpus:
        _put(raw, "NumberOfGPUs", label, processes * gpus)


def _attributes(value: Any, raw: Raw, extra: Raw) -> None:
    attrs = _mapping(value, "attributes")
    for key, item in attrs.items():
        if key == "duration":
            _put(raw, "CPUTime", "attributes.duration", item)
        elif key == "custom_attributes":
            _custom(item, raw, extra)
        elif key in {"queue_name", "account", "project_name", "reservation_id"}:
            _put(extra, key, f"attributes.{key}", item)
        else:
            raise JobDescriptionError(f"attributes.{key} is not a PSI/J job attribute",
                                      f"attributes.{key}")


def _custom(value: Any, raw: Raw, extra: Raw) -> None:
    custom = _mapping(value, "attributes.custom_attributes")
    for key, item in custom.items():
        label = f"attributes.custom_attributes.{key}"
        name = canonical_name(key)
        if name is None:
            _put(extra, key, label, item)
        elif name == "Requirements":
            _put(raw, name, label, _requirements(item, label))
        else:
            _put(raw, name, label, item)


def _requirements(value: Any, label: str) -> Any:
    """Requirements as the JDL parser stores them: a section, or an expression's canonical text.

    Canonical text makes the same expression compare equal however it is spaced, and parsing
    it here refuses a syntax error now rather than leaving it to fail at every match.
    """
    if isinstance(value, str):
        text = canonical_expression(value, label)  # refuses what is costly or malformed
        value = True if text == "true" else False if text == "false" else Expression(text)
    if value is True:
        return {}  # as "Requirements = true" in a JDL: no requirement at all
    if value is False:
        raise JobDescriptionError(f"{label} is false: no resource could ever run this job",
                                  label)
    if isinstance(value, Expression | Mapping):
        return value
    raise JobDescriptionError(
        f"{label} must be an object of resource requirements or a string holding a ClassAd "
        f"expression, got {_shown(value)}", label)


def _positive_int(value: Any, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobDescriptionError(f"{label} must be a positive integer, got {_shown(value)}",
                                  label)
    return value


def _kind(value: Any) -> str:
    """What a decoded value is, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _shown(value: Any) -> str:
    """A value as JSON, short enough for a message."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
