"""The one internal form of a job description, and the validation both input formats share.

A JDL (ClassAd) and its JSON equivalent are first turned into a mapping of canonical field
names (the JDL's) to ``(label, value)`` pairs, where the label is how the user wrote the field
("CPUTime", or "attributes.duration" in JSON); :func:`build_descriptions` validates that
mapping, expands parametric jobs and returns :class:`JobDescription` objects. Every error is a
:class:`JobDescriptionError` naming the field and saying what is wrong.
"""

from __future__ import annotations

import difflib
import json
import math
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from optimizers.expressions import ExpressionError, analyse, attributes_read
from optimizers.gridattributes import FOREIGN, foreign_notes
from optimizers.jobfields import PARAMETRIC, JobDescriptionError, Raw
from optimizers.jobfields import show as _show
from optimizers.parametric import (
    MAX_EXPANDED_BYTES,
    MAX_PARAMETER,
    MAX_PARAMETRIC_JOBS,
    expand,
    substitute,
    templated,
)
from taskqueue.core.definitions import DEFAULT_JOB_TYPE
from taskqueue.core.errors import InvalidInputError, InvalidRequirementsError
from taskqueue.files.replicas import normal_lfn
from taskqueue.queues.submitpools import canonical_requirements

__all__ = ["MAX_EXPANDED_BYTES", "MAX_PARAMETER", "MAX_PARAMETRIC_JOBS", "JobDescriptionError",
           "Raw"]

#: Largest job description accepted, in bytes of UTF-8.
MAX_DESCRIPTION_BYTES = 64 * 1024
DEFAULT_CPU_TIME = 86_400
#: Largest CPU time (s) and memory (MB) a job may ask for: 68 years, 1 PB (the memory bucket
#: of the largest value still fits the 32-bit column).
MAX_CPU_TIME = 2**31 - 1
MAX_MEMORY_MB = 2**30
#: Most GPUs a job may ask for (NumberOfGPUs).
MAX_GPUS = 64
#: Longest job name and job group (their database columns).
MAX_JOB_NAME = 255
MAX_JOB_GROUP = 128
DEFAULT_PRIORITY = 1

JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]


@dataclass(frozen=True)
class JobDescription:
    """A validated job, whatever format it came in."""

    executable: str
    arguments: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    directory: str | None = None
    #: The file of the job's folder its standard input is read from (shipped in the
    #: InputSandbox); None: no input.
    stdin: str | None = None
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
    #: GPUs the job needs (NumberOfGPUs); 0: none.
    gpus: int = 0
    #: RFC 7 requirements section, canonicalised (see taskqueue.queues.submitpools).
    requirements: Mapping[str, Any] | None = None
    #: A gLite-style ClassAd Requirements expression, as canonical ClassAd text.
    requirements_expression: str | None = None
    #: The files (LFNs, without "LFN:") the job reads from grid storage (InputData): it runs
    #: only where every one has a replica (the chain's data step).
    input_data: tuple[str, ...] = ()
    #: The scopes its payload's token is to have (narrower than the VO grants; empty: all
    #: that the VO grants).
    token_scopes: tuple[str, ...] = ()
    #: The container image its payload runs in (a path on the worker node: an unpacked image
    #: folder, as on CVMFS, or an image file); None: the node's own system.
    container_image: str | None = None
    #: The parameter this job was expanded for, in a parametric bulk.
    parameter: str | None = None
    #: Fields gridpilot does not interpret: kept and passed to the payload.
    extra: Mapping[str, JSONValue] = field(default_factory=dict)
    #: What the submitter should know: where gridpilot reads the description differently
    #: from DIRAC or gLite, or uses it otherwise than they do.
    warnings: tuple[str, ...] = ()

    def for_job(self, job_id: int) -> JobDescription:
        """The description with DIRAC's ``%j`` (the job's id) replaced, as a payload runs it."""
        def text(value: Any) -> Any:
            if isinstance(value, str):
                return value.replace("%j", str(job_id))
            if isinstance(value, list | tuple):
                return type(value)(text(v) for v in value)
            if isinstance(value, dict):
                return {k: text(v) for k, v in value.items()}
            return value
        return replace(
            self, executable=text(self.executable), arguments=text(self.arguments),
            environment=text(dict(self.environment)), directory=text(self.directory),
            stdin=text(self.stdin), stdout=text(self.stdout), stderr=text(self.stderr),
            input_sandbox=text(self.input_sandbox), output_sandbox=text(self.output_sandbox),
            job_name=text(self.job_name), extra=text(dict(self.extra)))


def payload_fields(desc: JobDescription, job_id: int) -> dict[str, Any]:
    """The fields of pilot.protocol.JobPayload that job ``job_id``'s description gives
    (``%j`` replaced, :meth:`JobDescription.for_job`), in that class's order."""
    if _has_job_mark(desc):
        desc = desc.for_job(job_id)
    return {
        "executable": desc.executable, "arguments": list(desc.arguments),
        "environment": dict(desc.environment), "cpu_time": desc.cpu_time,
        "processors": desc.processors, "memory": desc.memory, "gpus": desc.gpus,
        "input_sandbox": list(desc.input_sandbox), "output_sandbox": list(desc.output_sandbox),
        "stdout": desc.stdout, "stderr": desc.stderr, "stdin": desc.stdin,
        "job_name": desc.job_name, "container_image": desc.container_image,
        "extra": dict(desc.extra)}


#: The key of the stored payload (:func:`payload_json`) that holds the scopes the job asks
#: for its payload's token (``TokenScopes``): read for the first token of the match answer,
#: never handed to the pilot. A payload stored without it (before it was stored) is older.
ASKED_SCOPES = "token_scopes"


def payload_json(desc: JobDescription, job_id: int) -> str:
    """:func:`payload_fields` and the scopes the job asks for (:data:`ASKED_SCOPES`) as
    compact JSON, as stored with the job (job_payloads) for the match answer (ASCII: a lone
    surrogate of a text stays an escape)."""
    return json.dumps({**payload_fields(desc, job_id), ASKED_SCOPES: list(desc.token_scopes)},
                      separators=(",", ":"))


def _has_job_mark(desc: JobDescription) -> bool:
    """Whether a text field :meth:`JobDescription.for_job` rewrites holds ``%j`` (most do
    not, and then the description is the job's as it is)."""
    def holds(value: Any) -> bool:
        if isinstance(value, str):
            return "%j" in value
        if isinstance(value, list | tuple):
            return any(holds(v) for v in value)
        if isinstance(value, Mapping):
            return any(holds(v) for v in value.values())
        return False
    return any(holds(v) for v in (
        desc.executable, desc.arguments, desc.environment, desc.directory, desc.stdin,
        desc.stdout, desc.stderr, desc.input_sandbox, desc.output_sandbox, desc.job_name,
        desc.extra))


#: Canonical field names (JDL spelling) → the key the description uses. Lookup is
#: case-insensitive, like ClassAd attribute names.
KNOWN_FIELDS = (
    "Executable", "Arguments", "Environment", "Directory", "StdInput", "StdOutput", "StdError",
    "InputSandbox", "OutputSandbox", "JobName", "JobGroup", "JobType", "Priority", "CPUTime",
    "Site", "BannedSite", "Platform", "Tags", "NumberOfProcessors", "MinNumberOfProcessors",
    "MaxNumberOfProcessors", "MaxRAM", "NumberOfGPUs", "Requirements", "GridCE", "InputData",
    "DataRequirements", "TokenScopes", "ContainerImage", *PARAMETRIC,
)
CANONICAL = {name.lower(): name for name in KNOWN_FIELDS}
CANONICAL["bannedsites"] = "BannedSite"
CANONICAL["tag"] = "Tags"
CANONICAL["gridces"] = "GridCE"
#: DIRAC's Job API writes the environment as ExecutionEnvironment = {"A=1", "B=2"}.
CANONICAL["executionenvironment"] = "Environment"

_NAME = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}$")
#: Fields that hold names (lists of them): a string with commas is a list, as DIRAC reads it.
_LABEL_LISTS = ("Site", "BannedSite", "Platform", "Tags", "GridCE", "InputData")
#: Fields that hold lists: an empty string in them is no item.
_LISTS = (*_LABEL_LISTS, "InputSandbox", "OutputSandbox")
#: gLite's kinds of job: not job types of the VO.
_GLITE_KINDS = {"normal": "Normal", "parametric": "Parametric"}


def description_warnings(jobs: Iterable[JobDescription]) -> list[str]:
    """What the submitter of ``jobs`` should know, once each: the jobs' own warnings, then one
    per field gridpilot does not know, naming the known field it is closest to (a misspelt
    ``NumberOfProcesors`` is not a request for processors)."""
    warnings: list[str] = []
    seen: set[str] = set()
    for job in jobs:
        for warning in job.warnings:
            if warning not in seen:
                seen.add(warning)
                warnings.append(warning)
        for name in job.extra:
            if name in seen:
                continue
            seen.add(name)
            if name.lower() in FOREIGN:
                continue  # the job's warnings say what becomes of it
            close = difflib.get_close_matches(name.lower(), list(CANONICAL), n=1, cutoff=0.75)
            hint = (f"did you mean {CANONICAL[close[0]]}? " if close else "")
            warnings.append(f"the attribute {name!r} is not one gridpilot knows: {hint}it is "
                            "kept and passed to the job, but it sets no requirement")
    return warnings


def canonical_name(name: str) -> str | None:
    """The field a name stands for (case-insensitive), or None for one gridpilot does not
    know; a named parametric sequence keeps its name: ``parameterstart.A`` is
    ``ParameterStart.A``."""
    head, dot, sequence = name.partition(".")
    if dot:
        field_name = CANONICAL.get(head.lower())
        if field_name in PARAMETRIC and re.fullmatch(r"\w+", sequence):
            return f"{field_name}.{sequence}"
        return None
    return CANONICAL.get(name.lower())


def build_descriptions(raw: Raw, extra: Mapping[str, JSONValue]) -> list[JobDescription]:
    """Validate ``raw`` fields into one description, or one per parameter of a parametric job
    (optimizers.parametric)."""
    raw = _dirac_values(raw)
    warnings = foreign_notes(extra)
    glite = _glite_kind(raw, warnings)
    expansion = expand(raw, glite)
    if expansion is None:
        if glite:
            raise JobDescriptionError(
                'JobType = "Parametric" needs Parameters (a list of values, or where the '
                "range of numbers stops)", raw.get("JobType", ("JobType", None))[0])
        return [_build(raw, extra, None, warnings)]
    count = len(expansion.jobs)
    per_job = len(repr(extra)) + sum(len(repr(value)) for _label, value in raw.values())
    if per_job * count > MAX_EXPANDED_BYTES:
        label = raw["Parameters"][0]
        raise JobDescriptionError(
            f"{label}: {count} jobs of about {per_job} bytes each would be "
            f"{per_job * count // (1024 * 1024)} MB of job descriptions; at most "
            f"{MAX_EXPANDED_BYTES // (1024 * 1024)} MB can be submitted at once", label)
    warnings += expansion.warnings
    if not glite and "_PARAM_" in repr(raw) + repr(extra):
        warnings.append("_PARAM_ (gLite's placeholder) is replaced by each job's parameter "
                        "(DIRAC leaves it as it is and uses %s)")
    extra_raw: Raw = {name: (name, value) for name, value in extra.items()}
    in_raw, in_extra = templated(raw), templated(extra_raw)
    jobs = []
    for index, values in enumerate(expansion.jobs):
        job_extra = ({name: value for name, (_label, value)
                      in substitute(extra_raw, values, index, count, in_extra).items()}
                     if in_extra else extra)
        jobs.append(_build(_dirac_values(substitute(raw, values, index, count, in_raw)),
                           job_extra, expansion.parameter(index), warnings))
    return jobs


def _dirac_values(raw: Raw) -> Raw:
    """``raw`` with DIRAC's forms of "nothing" and of lists read as DIRAC reads them: an empty
    string is no value (``Site = "";``), an empty item no item (``InputSandbox = {""};``), and
    a string with commas in a field of names is their list (``Site = "LCG.A.fr,LCG.B.fr"``)."""
    out: Raw = {}
    for name, (label, value) in raw.items():
        if name in _LABEL_LISTS and isinstance(value, str) and "," in value:
            value = [part.strip() for part in value.split(",")]
        if name in _LISTS and isinstance(value, list):
            value = [v for v in value if not (isinstance(v, str) and not v.strip())]
            if not value:
                continue
        if isinstance(value, str) and not value.strip() and name != "Executable":
            continue
        out[name] = (label, value)
    return out


def _glite_kind(raw: Raw, warnings: list[str]) -> bool:
    """Whether the job is a gLite parametric job; a gLite kind of job (``JobType =
    "Normal"``) is taken out of ``raw``: it is not a job type of the VO."""
    if "JobType" not in raw:
        return False
    label, value = raw["JobType"]
    kind = _GLITE_KINDS.get(value.lower()) if isinstance(value, str) else None
    if kind is None:
        return False
    del raw["JobType"]
    warnings.append(f'{label} = "{value}" is gLite\'s kind of job, not a job type: the job\'s '
                    f'type is {DEFAULT_JOB_TYPE} (DIRAC would take "{value}" as its type)')
    return kind == "Parametric"


def _build(raw: Raw, extra: Mapping[str, JSONValue], parameter: str | None,
           warnings: list[str]) -> JobDescription:
    executable = _string(raw, "Executable", required=True)
    assert executable is not None
    processors, max_processors = _processors(raw)
    requirements, expression = _requirements(raw)
    image = _container_image(raw)
    tags = frozenset(_labels(raw, "Tags")) | (
        {container_tag(image)} if image is not None else frozenset())
    return JobDescription(
        executable=executable,
        arguments=_arguments(raw),
        environment=_environment(raw),
        directory=_string(raw, "Directory"),
        stdin=_job_file(raw, "StdInput"),
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
        tags=tags,
        ces=frozenset(_labels(raw, "GridCE")),
        memory=_integer(raw, "MaxRAM", 0, low=0, high=MAX_MEMORY_MB,
                        what="a non-negative integer number of MB"),
        processors=processors,
        max_processors=max_processors,
        gpus=_integer(raw, "NumberOfGPUs", 0, low=0, high=MAX_GPUS,
                      what=f"an integer from 0 to {MAX_GPUS}"),
        requirements=requirements,
        requirements_expression=expression,
        input_data=_input_data(raw, warnings),
        token_scopes=_strings(raw, "TokenScopes"),
        container_image=image,
        parameter=parameter,
        extra=dict(extra),
        warnings=tuple(dict.fromkeys(warnings + _sandbox_notes(raw)
                                     + executable_notes(executable,
                                                        _strings(raw, "InputSandbox"))
                                     + _expression_notes(expression))),
    )


#: The tag a pilot offers when it can run a job in an image folder (any of its isolation
#: tools), and the one for an image file (apptainer only).
CONTAINER_TAG, IMAGE_FILE_TAG = "container", "apptainer"
#: Image files by their ending; anything else is an unpacked image folder.
IMAGE_FILE_ENDINGS = (".sif", ".img", ".simg")
MAX_IMAGE_PATH = 1024


def container_tag(image: str) -> str:
    """The tag a pilot must offer to run a job in ``image``."""
    return IMAGE_FILE_TAG if image.lower().endswith(IMAGE_FILE_ENDINGS) else CONTAINER_TAG


def _container_image(raw: Raw) -> str | None:
    """ContainerImage: an absolute path on the worker node, without "..", at most
    MAX_IMAGE_PATH characters."""
    image = _string(raw, "ContainerImage")
    if image is None:
        return None
    label = raw["ContainerImage"][0]
    if (not image.startswith("/") or len(image) > MAX_IMAGE_PATH
            or ".." in image.split("/") or any(ord(c) < 32 or ord(c) == 127 for c in image)):
        raise JobDescriptionError(
            f"{label} must be the absolute path of an image on the worker node (an unpacked "
            f"image folder, e.g. on /cvmfs, or a .sif file), without '..', at most "
            f"{MAX_IMAGE_PATH} characters; got {_show(image)}", label)
    return image


def _input_data(raw: Raw, warnings: list[str]) -> tuple[str, ...]:
    """The LFNs of InputData, of gLite's DataRequirements and of the InputSandbox (DIRAC
    treats its LFN: entries as input data too), each once, without "LFN:"."""
    lfns = list(_strings(raw, "InputData"))
    lfns += [e for e in _strings(raw, "InputSandbox") if e[:4].upper() == "LFN:"]
    if "DataRequirements" in raw:
        label, value = raw["DataRequirements"]
        sections = value if isinstance(value, list) else [value]
        for i, section in enumerate(sections):
            if not isinstance(section, Mapping):
                raise JobDescriptionError(
                    f"{label} item {i} must be a section [ InputData = {{...}}; ... ], got "
                    f"{_show(section)}", label)
            for key, files in section.items():
                if key.lower() == "inputdata":
                    lfns += _strings({key: (f"{label}.{key}", files)}, key)
        warnings.append(f"{label}: the InputData files it lists decide where the job runs, "
                        "from gridpilot's replica catalogue (DataCatalog is not used)")
    out: list[str] = []
    for lfn in lfns:
        try:
            name = normal_lfn(lfn)
        except InvalidInputError as exc:
            label = raw.get("InputData", raw.get("DataRequirements", ("InputData", None)))[0]
            raise JobDescriptionError(f"{label}: {exc.message}", label) from exc
        if name not in out:
            out.append(name)
    return tuple(out)


#: What every pilot's resource description gives an expression (optimizers.classads); a
#: pilot may describe more, from its own resource description.
_DESCRIBED = frozenset(name.lower() for name in (
    "VO", "Site", "CE", "Queue", "Platform", "Tags", "CPUTime", "NumberOfProcessors", "Memory",
    "MaxRAM", "NumberOfGPUs"))


def _expression_notes(expression: str | None) -> list[str]:
    """A warning when a Requirements expression reads attributes gridpilot's pilots do not
    describe (gLite's GlueCE... attributes): the job waits for a pilot that gives them."""
    if expression is None:
        return []
    unknown = list(dict.fromkeys(
        name for name in attributes_read(expression)
        if "." in name and name.split(".", 1)[1].lower() not in _DESCRIBED))
    if not unknown:
        return []
    return [f"Requirements reads {', '.join(unknown[:3])}{' and more' if len(unknown) > 3 else ''},"
            " which gridpilot's pilots do not describe unless their resource description "
            "gives it: the job runs only where one does (pilots describe VO, Site, CE, Queue, "
            "Platform, Tags, CPUTime, NumberOfProcessors, Memory, MaxRAM, NumberOfGPUs)"]


def _sandbox_notes(raw: Raw) -> list[str]:
    """A warning for the InputSandbox entries in grid storage (DIRAC downloads them)."""
    lfns = [e for e in _strings(raw, "InputSandbox") if e[:4].upper() == "LFN:"]
    if not lfns:
        return []
    return [f"InputSandbox lists {lfns[0]}{' and more LFN: entries' if len(lfns) > 1 else ''}"
            ": gridpilot does not download files from grid storage for the job (the job "
            "fetches them itself), but sends it only where they have a replica, as InputData"]


#: Endings of script and program files: a name without "/" that ends so is taken for a file the
#: job brings, not a command of the worker node's PATH (client.sandboxes keeps the same list).
SCRIPT_SUFFIXES = (".sh", ".bash", ".csh", ".tcsh", ".ksh", ".zsh", ".py", ".pl", ".rb",
                   ".exe")


def looks_like_file(executable: str) -> bool:
    """Whether a relative ``executable`` names a file the job must bring rather than a
    command the worker node has on its PATH: it has a "/" in it ("bin/run.sh", "./run"),
    or a script's or program's ending ("run.sh", "analysis.py")."""
    return "/" in executable or executable.lower().endswith(SCRIPT_SUFFIXES)


def executable_notes(executable: str, input_sandbox: Iterable[str]) -> list[str]:
    """A warning when ``executable`` names a file relative to the job's folder that nothing
    brings there: the InputSandbox lists no sandbox (the service does not open sandboxes at
    submission; gridpilot-client checks their files before it uploads them). A name without
    "/" and without a script's ending is taken for a command on the worker node's PATH."""
    name = executable.strip()
    if (not name or name.startswith("/") or re.search(r"[$%]|_PARAM_", name)
            or not looks_like_file(name)):
        return []
    entries = [e.strip() for e in input_sandbox]
    if any(e[:3].lower() == "sb:" for e in entries):
        return []
    path = posixpath.normpath(name)
    if path == ".." or path.startswith("../"):
        return [f'Executable "{name[:200]}" names a file outside the job\'s folder, where the '
                "pilot starts it and where nothing outside that folder is shipped (the pilot "
                "makes no such file executable): give an absolute path, or a file of the "
                "InputSandbox by its name in the folder"]
    top = path.split("/", 1)[0]
    for entry in entries:
        if entry[:4].upper() == "LFN:":
            continue
        # A file by its own name, a folder with what is in it (as gridpilot-client packs
        # them); the name as it is, for descriptions not read by the client.
        local = entry[7:] if entry[:7].lower() == "file://" else entry
        if top == posixpath.basename(local.rstrip("/")) or path == posixpath.normpath(local):
            return []
    wanted = path.rsplit("/", 1)[-1]
    lfns = [e for e in entries if e[:4].upper() == "LFN:" and e.rstrip("/").rsplit("/", 1)[-1]
            == wanted]
    where = (f"the InputSandbox lists it as {lfns[0]}, in grid storage, which gridpilot "
             "does not download before the job starts" if lfns else
             "the InputSandbox ships no file" if not entries else
             "the InputSandbox ships no uploaded file")
    return [f'Executable "{name}" names a file in the job\'s folder, but {where}: the job '
            "will fail to start unless the worker node has it. List the file in the "
            "InputSandbox (gridpilot-client submit uploads it) or give an absolute path"]


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


def _format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)
