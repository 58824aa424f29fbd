"""The one internal form of a job description, and the validation both input formats share.

A JDL (ClassAd) and its JSON equivalent are first turned into a mapping of canonical field
names (the JDL's) to ``(label, value)`` pairs, where the label is how the user wrote the field
("CPUTime", or "attributes.duration" in JSON); :func:`build_descriptions` validates that
mapping, expands parametric jobs and returns :class:`JobDescription` objects. Every error is a
:class:`JobDescriptionError` naming the field and saying what is wrong.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optimizers.expressions import ExpressionError, analyse
from taskqueue.definitions import DEFAULT_JOB_TYPE
from taskqueue.errors import InvalidInputError, InvalidRequirementsError
from taskqueue.submitpools import canonical_requirements

#: Largest job description accepted, in bytes of UTF-8.
MAX_DESCRIPTION_BYTES = 64 * 1024
#: Most jobs one parametric description may expand into, and most bytes of text they may
#: hold together (a 60 KB description times 10,000 jobs would take gigabytes).
MAX_PARAMETRIC_JOBS = 10_000
MAX_EXPANDED_BYTES = 16 * 1024 * 1024
#: Largest absolute value a numeric parameter may reach.
MAX_PARAMETER = 1e15
DEFAULT_CPU_TIME = 86_400
#: Largest CPU time (s) and memory (MB) a job may ask for: 68 years, 1 PB (the memory bucket
#: of the largest value still fits the 32-bit column).
MAX_CPU_TIME = 2**31 - 1
MAX_MEMORY_MB = 2**30
#: Longest job name and job group (their database columns).
MAX_JOB_NAME = 255
MAX_JOB_GROUP = 128
DEFAULT_PRIORITY = 1

JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
Raw = dict[str, tuple[str, Any]]


class JobDescriptionError(InvalidInputError):
    """A job description is malformed; ``field`` names the offending field, if there is one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class JobDescription:
    """A validated job, whatever format it came in."""

    executable: str
    arguments: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    directory: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    input_sandbox: tuple[str, ...] = ()
    output_sandbox: tuple[str, ...] = ()
    job_name: str | None = None
    #: A label the owner groups jobs under (a campaign, a production): listed and searched by.
    job_group: str | None = None
    job_type: str = DEFAULT_JOB_TYPE
    priority: int = DEFAULT_PRIORITY
    #: Requested CPU time in normalised (reference) seconds.
    cpu_time: int = DEFAULT_CPU_TIME
    sites: frozenset[str] = frozenset()
    banned_sites: frozenset[str] = frozenset()
    platforms: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset()
    #: Computing elements the job may run on (GridCE, GridCEs); empty: any.
    ces: frozenset[str] = frozenset()
    processors: int = 1
    max_processors: int | None = None
    #: Memory in MB; 0 for no requirement.
    memory: int = 0
    #: RFC 7 requirements section, canonicalised (see taskqueue.submitpools).
    requirements: Mapping[str, Any] | None = None
    #: A gLite-style ClassAd Requirements expression, as canonical ClassAd text.
    requirements_expression: str | None = None
    #: The parameter this job was expanded for, in a parametric bulk.
    parameter: str | None = None
    #: Fields gridpilot does not interpret: kept and passed to the payload.
    extra: Mapping[str, JSONValue] = field(default_factory=dict)


#: Canonical field names (JDL spelling) → the key the description uses. Lookup is
#: case-insensitive, like ClassAd attribute names.
KNOWN_FIELDS = (
    "Executable", "Arguments", "Environment", "Directory", "StdOutput", "StdError",
    "InputSandbox", "OutputSandbox", "JobName", "JobGroup", "JobType", "Priority", "CPUTime",
    "Site", "BannedSite", "Platform", "Tags", "NumberOfProcessors", "MinNumberOfProcessors",
    "MaxNumberOfProcessors", "MaxRAM", "Requirements", "Parameters", "ParameterStart",
    "ParameterStep", "ParameterFactor", "GridCE",
)
CANONICAL = {name.lower(): name for name in KNOWN_FIELDS}
CANONICAL["bannedsites"] = "BannedSite"
CANONICAL["tag"] = "Tags"
CANONICAL["gridces"] = "GridCE"

#: Fields in which a parametric job's ``%s`` (the parameter) and ``%n`` (its index) are replaced.
_TEMPLATED = ("Executable", "Arguments", "JobName", "StdOutput", "StdError", "InputSandbox",
              "OutputSandbox", "Environment", "Directory")
_NAME = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}$")


def unknown_field_warnings(jobs: Iterable[JobDescription]) -> list[str]:
    """One warning per field of ``jobs`` gridpilot does not know, naming the known field it
    is closest to (a misspelt ``NumberOfProcesors`` is not a request for processors)."""
    warnings = []
    seen: set[str] = set()
    for job in jobs:
        for name in job.extra:
            if name in seen:
                continue
            seen.add(name)
            close = difflib.get_close_matches(name.lower(), list(CANONICAL), n=1, cutoff=0.75)
            hint = (f"did you mean {CANONICAL[close[0]]}? " if close else "")
            warnings.append(f"the attribute {name!r} is not one gridpilot knows: {hint}it is "
                            "kept and passed to the job, but it sets no requirement")
    return warnings


def canonical_name(name: str) -> str | None:
    return CANONICAL.get(name.lower())


def build_descriptions(raw: Raw, extra: Mapping[str, JSONValue]) -> list[JobDescription]:
    """Validate ``raw`` fields into one description, or one per parameter of a parametric job."""
    parameters = _parameters(raw)
    if parameters is None:
        return [_build(raw, extra, None)]
    per_job = sum(len(repr(raw[name][1])) for name in _TEMPLATED if name in raw)
    if per_job * len(parameters) > MAX_EXPANDED_BYTES:
        label = raw["Parameters"][0]
        raise JobDescriptionError(
            f"{label}: {len(parameters)} jobs of about {per_job} bytes each would be "
            f"{per_job * len(parameters) // (1024 * 1024)} MB of job descriptions; at most "
            f"{MAX_EXPANDED_BYTES // (1024 * 1024)} MB can be submitted at once", label)
    jobs = []
    for index, value in enumerate(parameters):
        text = _format_number(value) if not isinstance(value, str) else value
        jobs.append(_build(_substitute(raw, text, index), extra, text))
    return jobs


def _build(raw: Raw, extra: Mapping[str, JSONValue], parameter: str | None) -> JobDescription:
    executable = _string(raw, "Executable", required=True)
    assert executable is not None
    processors, max_processors = _processors(raw)
    requirements, expression = _requirements(raw)
    return JobDescription(
        executable=executable,
        arguments=_arguments(raw),
        environment=_environment(raw),
        directory=_string(raw, "Directory"),
        stdout=_job_file(raw, "StdOutput"),
        stderr=_job_file(raw, "StdError"),
        input_sandbox=_strings(raw, "InputSandbox"),
        output_sandbox=_job_files(raw, "OutputSandbox"),
        job_name=_bounded(raw, "JobName", MAX_JOB_NAME),
        job_group=_bounded(raw, "JobGroup", MAX_JOB_GROUP),
        job_type=_label(raw, "JobType") or DEFAULT_JOB_TYPE,
        priority=_integer(raw, "Priority", DEFAULT_PRIORITY, low=0, high=10,
                          what="an integer from 0 to 10"),
        cpu_time=_integer(raw, "CPUTime", DEFAULT_CPU_TIME, low=1, high=MAX_CPU_TIME,
                          what="a positive integer number of seconds"),
        sites=frozenset(_labels(raw, "Site")),
        banned_sites=frozenset(_labels(raw, "BannedSite")),
        platforms=frozenset(_labels(raw, "Platform")),
        tags=frozenset(_labels(raw, "Tags")),
        ces=frozenset(_labels(raw, "GridCE")),
        memory=_integer(raw, "MaxRAM", 0, low=0, high=MAX_MEMORY_MB,
                        what="a non-negative integer number of MB"),
        processors=processors,
        max_processors=max_processors,
        requirements=requirements,
        requirements_expression=expression,
        parameter=parameter,
        extra=dict(extra),
    )


def _processors(raw: Raw) -> tuple[int, int | None]:
    exact = "NumberOfProcessors" in raw
    ranged = "MinNumberOfProcessors" in raw or "MaxNumberOfProcessors" in raw
    if exact and ranged:
        raise JobDescriptionError(
            f"{raw['NumberOfProcessors'][0]} cannot be combined with MinNumberOfProcessors or "
            "MaxNumberOfProcessors: give either an exact number or a range",
            raw["NumberOfProcessors"][0])
    what = "a positive integer of at most 4096"
    if exact:
        n = _integer(raw, "NumberOfProcessors", 1, low=1, high=4096, what=what)
        return n, n
    low = _integer(raw, "MinNumberOfProcessors", 1, low=1, high=4096, what=what)
    high = (_integer(raw, "MaxNumberOfProcessors", 1, low=1, high=4096, what=what)
            if "MaxNumberOfProcessors" in raw else None)
    if high is not None and high < low:
        raise JobDescriptionError(
            f"{raw['MaxNumberOfProcessors'][0]} ({high}) must not be smaller than "
            f"MinNumberOfProcessors ({low})", raw["MaxNumberOfProcessors"][0])
    return low, high


def _requirements(raw: Raw) -> tuple[Mapping[str, Any] | None, str | None]:
    """The RFC 7 requirements section and the ClassAd expression (at most one is given)."""
    if "Requirements" not in raw:
        return None, None
    label, value = raw["Requirements"]
    if isinstance(value, Expression):
        try:
            analyse(value.text)
        except ExpressionError as exc:
            raise JobDescriptionError(f"{label} {exc}", label) from exc
        return None, value.text
    if isinstance(value, Mapping):
        if not value:
            return None, None
        try:
            return canonical_requirements(value), None
        except InvalidRequirementsError as exc:
            raise JobDescriptionError(f"{label}: {exc.message}", label) from exc
    raise JobDescriptionError(
        f"{label} must be a section of resource requirements ([ Name = value; ... ]) or a "
        f"ClassAd expression, got {_show(value)}", label)


@dataclass(frozen=True)
class Expression:
    """A ClassAd expression given as the value of a field (gLite-style Requirements)."""

    text: str


def _parameters(raw: Raw) -> list[str | int | float] | None:
    if "Parameters" not in raw:
        for name in ("ParameterStart", "ParameterStep", "ParameterFactor"):
            if name in raw:
                raise JobDescriptionError(
                    f"{raw[name][0]} is only meaningful with Parameters (a list of values or a "
                    "number of jobs)", raw[name][0])
        return None
    label, value = raw["Parameters"]
    if isinstance(value, list):
        if not value:
            raise JobDescriptionError(f"{label} must not be an empty list", label)
        if len(value) > MAX_PARAMETRIC_JOBS:
            raise JobDescriptionError(
                f"{label} lists {len(value)} values; at most {MAX_PARAMETRIC_JOBS} jobs can be "
                "submitted at once", label)
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                raise JobDescriptionError(
                    f"{label} item {i} must be a string or a number, got {_show(item)}", label)
        return list(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobDescriptionError(
            f"{label} must be a list of values or a positive number of jobs, got {_show(value)}",
            label)
    if value > MAX_PARAMETRIC_JOBS:
        raise JobDescriptionError(
            f"{label} asks for {value} jobs; at most {MAX_PARAMETRIC_JOBS} jobs can be "
            "submitted at once", label)
    start = _number(raw, "ParameterStart", 0)
    step = _number(raw, "ParameterStep", 1)
    factor = _number(raw, "ParameterFactor", 1)
    values: list[str | int | float] = []
    current = start
    for i in range(value):
        if abs(current) > MAX_PARAMETER:
            label = raw.get("ParameterFactor", raw.get("ParameterStep", (label, None)))[0]
            raise JobDescriptionError(
                f"{label} makes parameter {i} exceed {MAX_PARAMETER:.0e}; use smaller "
                "values or fewer jobs", label)
        values.append(_tidy(current))
        # from the start each time when the factor is 1: no rounding errors pile up
        current = start + (i + 1) * step if factor == 1 else current * factor + step
    return values


def _tidy(value: int | float) -> int | float:
    """A float parameter without the last-digit noise of binary arithmetic (0.1 * 3)."""
    return float(f"{value:.12g}") if isinstance(value, float) else value


def _substitute(raw: Raw, parameter: str, index: int) -> Raw:
    out = dict(raw)
    for name in _TEMPLATED:
        if name in raw:
            label, value = raw[name]
            out[name] = (label, _replace_in(value, parameter, index))
    return out


def _replace_in(value: Any, parameter: str, index: int) -> Any:
    if isinstance(value, str):
        return value.replace("%s", parameter).replace("%n", str(index))
    if isinstance(value, list):
        return [_replace_in(v, parameter, index) for v in value]
    if isinstance(value, dict):
        return {k: _replace_in(v, parameter, index) for k, v in value.items()}
    return value


def _format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def _string(raw: Raw, name: str, *, required: bool = False) -> str | None:
    if name not in raw:
        if required:
            raise JobDescriptionError(f"{name} is required: the program the job runs", name)
        return None
    label, value = raw[name]
    if not isinstance(value, str) or not value.strip():
        raise JobDescriptionError(f"{label} must be a non-empty string, got {_show(value)}",
                                  label)
    return value


def _job_file(raw: Raw, name: str) -> str | None:
    """A file name inside the job's folder: relative, without a .. component."""
    value = _string(raw, name)
    if value is not None:
        _inside_job_folder(raw[name][0], value)
    return value


def _job_files(raw: Raw, name: str) -> tuple[str, ...]:
    values = _strings(raw, name)
    for value in values:
        _inside_job_folder(raw[name][0], value)
    return values


def _inside_job_folder(label: str, value: str) -> None:
    if value.startswith(("/", "\\")):
        raise JobDescriptionError(
            f"{label} must name a file in the job's folder, not an absolute path: "
            f"{_show(value)}", label)
    if ".." in re.split(r"[/\\]", value):
        raise JobDescriptionError(
            f"{label} must name a file in the job's folder; {_show(value)} leads out of it "
            "with ..", label)
    if "\x00" in value:
        raise JobDescriptionError(f"{label} must not contain a NUL character", label)


def _bounded(raw: Raw, name: str, longest: int) -> str | None:
    """A one-line string of at most ``longest`` characters (a name stored in a column)."""
    value = _string(raw, name)
    if value is None:
        return None
    label = raw[name][0]
    if len(value) > longest:
        raise JobDescriptionError(
            f"{label} is {len(value)} characters long; at most {longest} are accepted", label)
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise JobDescriptionError(
            f"{label} must be one line of text without control characters, got {_show(value)}",
            label)
    return value


def _label(raw: Raw, name: str) -> str | None:
    value = _string(raw, name)
    if value is not None and not _NAME.match(value):
        label = raw[name][0]
        raise JobDescriptionError(
            f"{label} must be a name of letters, digits and ._:+- (at most 64), "
            f"got {_show(value)}", label)
    return value


def _strings(raw: Raw, name: str) -> tuple[str, ...]:
    if name not in raw:
        return ()
    label, value = raw[name]
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise JobDescriptionError(
            f"{label} must be a string or a list of strings, got {_show(value)}", label)
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise JobDescriptionError(
                f"{label} item {i} must be a non-empty string, got {_show(item)}", label)
    return tuple(items)


def _labels(raw: Raw, name: str) -> list[str]:
    values = _strings(raw, name)
    for v in values:
        if not _NAME.match(v):
            label = raw[name][0]
            raise JobDescriptionError(
                f"{label} must hold names of letters, digits and ._:+- (at most 64), "
                f"got {_show(v)}", label)
    if name == "Site" and any(v.upper() == "ANY" for v in values):
        return []  # "ANY" site: no restriction
    return list(values)


#: Arguments that shlex would split at whitespace alone, and the whitespace it splits at.
_PLAIN_WORDS = re.compile(r"[^'\"\\]*\Z")
_SHLEX_SPACE = re.compile(r"[ \t\r\n]+")


def _arguments(raw: Raw) -> tuple[str, ...]:
    if "Arguments" not in raw:
        return ()
    label, value = raw["Arguments"]
    if isinstance(value, str):
        if _PLAIN_WORDS.match(value):
            # No quote and no backslash: shlex would only split at its whitespace, and a
            # parametric bulk splits one argument string per job (shlex reads a character
            # at a time in Python).
            return tuple(word for word in _SHLEX_SPACE.split(value) if word)
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise JobDescriptionError(f"{label} cannot be split into words: {exc}",
                                      label) from exc
    return _strings(raw, "Arguments")


def _environment(raw: Raw) -> dict[str, str]:
    if "Environment" not in raw:
        return {}
    label, value = raw["Environment"]
    pairs: list[tuple[str, Any]]
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise JobDescriptionError(
                f"{label} must be a list of \"NAME=value\" strings or a table, "
                f"got {_show(value)}", label)
        pairs = []
        for i, item in enumerate(items):
            if not isinstance(item, str) or "=" not in item:
                raise JobDescriptionError(
                    f"{label} item {i} must be a \"NAME=value\" string, got {_show(item)}",
                    label)
            pairs.append(tuple(item.split("=", 1)))  # type: ignore[arg-type]
    env: dict[str, str] = {}
    for key, val in pairs:
        if not isinstance(key, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise JobDescriptionError(
                f"{label}: {_show(key)} is not a valid environment variable name", label)
        if isinstance(val, bool) or not isinstance(val, str | int | float):
            raise JobDescriptionError(
                f"{label}: the value of {key} must be a string, got {_show(val)}", label)
        env[key] = val if isinstance(val, str) else _format_number(val)
    return env


def _integer(raw: Raw, name: str, default: int, *, low: int, high: int | None = None,
             what: str) -> int:
    if name not in raw:
        return default
    label, value = raw[name]
    number = _as_integer(value)
    if number is not None and high is not None and number > high and str(high) not in what:
        raise JobDescriptionError(f"{label} must be {what} of at most {high}, got "
                                  f"{_show(value)}", label)
    if number is None or number < low or (high is not None and number > high):
        raise JobDescriptionError(f"{label} must be {what}, got {_show(value)}", label)
    return number


def _as_integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value):
        return int(value)
    return None


def _number(raw: Raw, name: str, default: int | float) -> int | float:
    if name not in raw:
        return default
    label, value = raw[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise JobDescriptionError(f"{label} must be a number, got {_show(value)}", label)
    return value


def _show(value: Any) -> str:
    """A value as the user would recognise it in an error message (short)."""
    if isinstance(value, Expression):
        text = value.text
    elif isinstance(value, str):
        text = '"' + value.replace('"', '\\"') + '"'
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "nothing"
    elif isinstance(value, Sequence | Mapping) and not isinstance(value, str):
        text = repr(value)
    else:
        text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
