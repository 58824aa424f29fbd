"""ADL job descriptions (EMI-ES Activity Description Language, with NorduGrid's extensions), as
an ARC-CE takes them over REST.

ADL rather than xRSL: it is XML, so any value (a path with quotes, an argument with
parentheses) is escaped by the XML writer instead of by hand; a bulk of several jobs is one
``ActivityDescriptions`` element whose jobs the CE accepts or refuses one by one (a bulk of
xRSL jobs that one job spoils is refused whole by A-REX 6); and the delegation a job uses is
an element a client can add to a description it did not write (REST 1.0 has no other place
for it).

What a CE keeps: a job's session directory is emptied when the job ends, except for the files
its description names as output files; the standard output and error named here are added
to them, so that they can be downloaded afterwards. Input files are declared by name only:
the CE holds the job (PREPARING) until the client has uploaded each of them.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence

ADL = "http://www.eu-emi.eu/es/2010/12/adl"
NORDUGRID_ADL = "http://www.nordugrid.org/es/2011/12/nordugrid-adl"
#: The element a bulk of descriptions is wrapped in (A-REX reads its name without namespace).
BULK = "ActivityDescriptions"


#: What a job's executable and arguments must not hold: A-REX (6.17, every back end) puts
#: each in double quotes in the job's shell script, escaping only backslashes and double
#: quotes, so "$" and "`" are expanded on the worker node, and a line break cuts the argument.
#: Environment values are single-quoted there and may hold anything but NUL.
UNSAFE_IN_COMMAND = frozenset("$`\n\r\0")


class DescriptionError(ValueError):
    """A job description that cannot be written or read, with what is wrong."""


def check_file_name(name: str) -> str:
    """A file of a job's session directory: a relative path inside it."""
    parts = name.split("/")
    if (not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts)
            or any(c in name for c in "\0\n\r")):
        raise DescriptionError(f"{name!r} is not a file name inside a job's session directory")
    return name


def _sub(parent: ET.Element, tag: str, text: str | None = None, ns: str = ADL) -> ET.Element:
    element = ET.SubElement(parent, f"{{{ns}}}{tag}")
    if text is not None:
        element.text = text
    return element


def job_description(executable: str, arguments: Sequence[str] = (), *,
                    name: str = "gridpilot-pilot", queue: str | None = None, cores: int = 1,
                    memory_mb: int | None = None, wall_minutes: int | None = None,
                    environment: Mapping[str, str] | None = None,
                    input_files: Sequence[str] = (), output_files: Sequence[str] = (),
                    stdout: str = "pilot.out", stderr: str = "pilot.err") -> str:
    """One job's ADL text. ``executable`` is a path on the worker node (absolute) or a file of
    the session directory (then also list it in ``input_files`` and upload it). ``cores``
    slots on one host; ``memory_mb`` per slot; ``wall_minutes`` the wall-clock limit. Input
    files are uploaded by the client after the submission (never put a secret into a
    description: the CE shows descriptions to its operators); stdout, stderr and
    ``output_files`` are kept for download when the job ends."""
    if cores < 1:
        raise DescriptionError(f"a job needs at least one core, not {cores}")
    if memory_mb is not None and memory_mb < 1:
        raise DescriptionError(f"memory must be at least 1 MB, not {memory_mb}")
    if wall_minutes is not None and wall_minutes < 1:
        raise DescriptionError(f"the wall-clock limit must be at least a minute, not "
                               f"{wall_minutes}")
    if not executable:
        raise DescriptionError("a job needs an executable")
    for word in (executable, *arguments):
        unsafe = sorted(set(word) & UNSAFE_IN_COMMAND)
        if unsafe:
            raise DescriptionError(
                f"{word!r} holds {', '.join(map(repr, unsafe))}: A-REX writes a job's command "
                f"line in double quotes into a shell script, so the worker node's shell would "
                f"expand it; pass such values in the environment or in an input file")
    inputs = [check_file_name(f) for f in input_files]
    outputs = [check_file_name(f) for f in (stdout, stderr, *output_files)]
    for key, value in (environment or {}).items():
        if "\0" in value:
            raise DescriptionError(f"the value of {key} holds a NUL character")
        if not key or not (key[0].isalpha() or key[0] == "_") or not all(
                c.isalnum() or c == "_" for c in key):
            raise DescriptionError(f"{key!r} is not an environment variable's name")

    root = ET.Element(f"{{{ADL}}}ActivityDescription")
    ident = _sub(root, "ActivityIdentification")
    _sub(ident, "Name", name)
    app = _sub(root, "Application")
    exe = _sub(app, "Executable")
    _sub(exe, "Path", executable)
    for argument in arguments:
        _sub(exe, "Argument", argument)
    _sub(app, "Output", stdout)
    _sub(app, "Error", stderr)
    for key, value in (environment or {}).items():
        env = _sub(app, "Environment")
        _sub(env, "Name", key)
        _sub(env, "Value", value)
    res = _sub(root, "Resources")
    if queue:
        _sub(res, "QueueName", queue)
    slots = _sub(res, "SlotRequirement")
    _sub(slots, "NumberOfSlots", str(cores))
    _sub(slots, "SlotsPerHost", str(cores))
    if memory_mb is not None:
        _sub(res, "IndividualPhysicalMemory", str(memory_mb * 1024 * 1024))
    if wall_minutes is not None:
        _sub(res, "WallTime", str(wall_minutes * 60))
    staging = _sub(root, "DataStaging")
    for file in inputs:
        _sub(_sub(staging, "InputFile"), "Name", file)
    for file in dict.fromkeys(outputs):
        _sub(_sub(staging, "OutputFile"), "Name", file)
    return ET.tostring(root, encoding="unicode")


def _parse(description: str) -> ET.Element:
    try:
        root = ET.fromstring(description)
    except ET.ParseError as exc:
        raise DescriptionError(f"the job description is not XML: {exc}") from exc
    if root.tag != f"{{{ADL}}}ActivityDescription":
        raise DescriptionError(f"the job description is not an ADL ActivityDescription "
                               f"(its root is {root.tag})")
    return root


def with_delegation(description: str, delegation_id: str) -> str:
    """The description with the delegation its job uses (REST 1.0 reads it from the
    description's DataStaging; any earlier one is replaced)."""
    root = _parse(description)
    staging = root.find(f"{{{ADL}}}DataStaging")
    if staging is None:
        staging = _sub(root, "DataStaging")
    for old in staging.findall(f"{{{NORDUGRID_ADL}}}DelegationID"):
        staging.remove(old)
    _sub(staging, "DelegationID", delegation_id, ns=NORDUGRID_ADL)
    return ET.tostring(root, encoding="unicode")


def bulk(descriptions: Sequence[str]) -> str:
    """The request body for several jobs at once (one job: its own description)."""
    texts = [ET.tostring(_parse(d), encoding="unicode") for d in descriptions]
    if len(texts) == 1:
        return texts[0]
    return f"<{BULK}>{''.join(texts)}</{BULK}>"
