"""The client's side of sandboxes: before a description is submitted, the local files its
InputSandbox lists are packed into one archive, uploaded (unless the service has it already)
and replaced by the sandbox id; and a job's output sandbox is fetched and unpacked.

Entries that are sandbox ids, ``LFN:`` names or made from a job's parameter or id (``%s``,
``%n``, ``%(A)s``, ``_PARAM_``, ``%j``: each job would name another file) are left as they
are. ``file://`` URIs name local files. Relative names are read from the folder of the
description file; the archive holds each file under its own name (a folder with everything in
it).

A JDL's InputSandbox is found as the service reads it: outside strings and comments (``//``,
``#``, ``/* */``), quoted or bare (``InputSandbox = {jobDescription.xml, /home/u/f.py};``, as
DIRAC's Job API writes it), whatever characters the names hold.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

import pilot.tls as tls
import pilot.transfer as transfer
from client.service import Service, ServiceError
from pilot.archive import (
    MAX_UNPACKED_BYTES,
    Member,
    UnsafeArchiveError,
    is_sandbox_id,
    pack,
    unpack,
)

#: Largest sandbox archive downloaded (as large as the files it may unpack to).
MAX_DOWNLOAD_BYTES = MAX_UNPACKED_BYTES
#: A JDL's tokens: strings, comments, punctuation, and words (names, paths: a "/" that does
#: not start a comment belongs to the word).
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*|#[^\n]*|/\*.*?\*/|[\[\]{}();=,]'
                    r'|(?:[^\s\[\]{}();=,"#/]|/(?![/*]))+', re.DOTALL)
#: A name made from a job's parameter, index or id: another file for each job.
_TEMPLATE = re.compile(r"%[snj]|%\(\w+\)s|_PARAM_")


class SandboxFileError(ValueError):
    """A local file of the InputSandbox cannot be read; the message names it."""


class OutputFolderError(ValueError):
    """An output sandbox cannot be unpacked where asked (a name there exists already); the
    message says where and why."""


def is_local(entry: str) -> bool:
    """Whether an InputSandbox entry is a local file the client uploads."""
    return not (is_sandbox_id(entry) or entry[:4].upper() == "LFN:"
                or _TEMPLATE.search(entry) is not None)


def local_path(entry: str) -> str:
    """The path a local entry names (a ``file://`` URI's path, or the entry itself)."""
    return entry[len("file://"):] if entry[:7].lower() == "file://" else entry


def pack_local(names: list[str], base: Path) -> bytes:
    """One archive of the local files (and folders) ``names``, read relative to ``base``."""
    members: dict[str, Member] = {}
    for given in names:
        name = local_path(given)
        path = Path(name) if os.path.isabs(name) else base / name
        if path.is_dir():
            for root, _dirs, files in os.walk(path):
                for f in sorted(files):
                    full = Path(root) / f
                    arc = f"{path.name}/{full.relative_to(path).as_posix()}"
                    members[arc] = _member(arc, full, given)
        else:
            members[path.name] = _member(path.name, path, given)
    return pack(members.values())


def _member(arc: str, path: Path, given: str) -> Member:
    try:
        return Member(arc, path.read_bytes(), os.access(path, os.X_OK))
    except OSError as exc:
        raise SandboxFileError(f"InputSandbox file {given} cannot be read: "
                               f"{exc.strerror or exc}") from exc


def upload(service: Service, data: bytes) -> str:
    """Store ``data`` on the service (checksum first: nothing is sent when it has it already);
    return the sandbox id."""
    answer = service.call("POST", "/sandboxes", json={
        "checksum": hashlib.sha256(data).hexdigest(), "size": len(data)})
    if not answer.get("uploaded"):
        ticket = answer.get("upload") or {}
        url, headers = str(ticket.get("url", "")), dict(ticket.get("headers") or {})
        ours = url.startswith(service.url)
        try:
            # No token to the store; the same CAs.
            http = service.http if ours else tls.trusting(requests.Session(), service.http.verify)
            response = transfer.request(http, "PUT", url, data=data, headers=headers,
                                        deadline=service.timeout, follow=False)
        except requests.RequestException as exc:
            raise ServiceError(0, f"the sandbox upload failed: {exc}") from exc
        if response.status_code >= 400:
            raise ServiceError(response.status_code,
                               f"the sandbox upload was refused: {response.text[:200]}")
        if not ours:  # the object store has it: the service records it
            service.call("POST", "/sandboxes", json={
                "checksum": hashlib.sha256(data).hexdigest(), "size": len(data)})
    return str(answer["sandbox_id"])


def with_uploaded_inputs(text: str, fmt: str, base: Path,
                         store: Callable[[bytes], str]) -> str:
    """The description with its local InputSandbox files replaced by the id ``store`` gives
    for their archive (one archive for all of them: the jobs of a bulk share it)."""
    if fmt == "json":
        return _json_inputs(text, base, store)
    found = jdl_input_sandboxes(text)
    local = list(dict.fromkeys(e for _start, _end, entries in found for e in entries
                               if is_local(e)))
    if not local:
        return text
    sid = store(pack_local(local, base))
    out = text
    for start, end, entries in reversed(found):
        kept = [e for e in entries if not is_local(e)]
        listed = ", ".join(json.dumps(e, ensure_ascii=False) for e in [*kept, sid])
        out = out[:start] + "{" + listed + "}" + out[end:]
    return out


#: Endings of script and program files: a name without "/" that ends so is a file the job
#: brings, not a command of the worker node's PATH (as optimizers.description.SCRIPT_SUFFIXES).
SCRIPT_SUFFIXES = (".sh", ".bash", ".csh", ".tcsh", ".ksh", ".zsh", ".py", ".pl", ".rb",
                   ".exe")


def executable_warnings(text: str, fmt: str, base: Path) -> list[str]:
    """What to tell before the upload when a job's Executable names a file in its folder (a
    relative name with a "/" or a script's ending) that its local InputSandbox files, as the
    pilot unpacks them (each by its own name, a folder with what is in it), do not hold.
    Only for descriptions that list local files (the service warns about the others) and no
    sandbox id already (it may hold anything)."""
    warnings: list[str] = []
    for executable, entries in _executables(text, fmt):
        name = executable.strip()
        if (not name or name.startswith("/") or _TEMPLATE.search(name) or "$" in name
                or not ("/" in name or name.lower().endswith(SCRIPT_SUFFIXES))):
            continue
        local = [e for e in entries if is_local(e)]
        if not local or any(is_sandbox_id(e) for e in entries):
            continue
        names = _unpacked_names(local, base)
        wanted = posixpath.normpath(name)
        if wanted in names:
            continue
        own = posixpath.basename(wanted)
        hint = (f' ("{own}" is unpacked at the top of the folder, by its own name)'
                if own in names else "")
        warning = (f'Executable "{name}" is not among the InputSandbox files the job\'s '
                   f"folder will hold{hint}: the job will fail to start unless the worker "
                   "node has it")
        if warning not in warnings:
            warnings.append(warning)
    return warnings


def _executables(text: str, fmt: str) -> list[tuple[str, list[str]]]:
    """Each job's Executable and InputSandbox entries (none when the text does not read:
    the service will say what is wrong)."""
    if fmt != "json":
        entries = [e for _s, _e, found in jdl_input_sandboxes(text) for e in found]
        return [(e, entries) for _s, _e, found in _jdl_values(text, "executable")
                for e in found[:1]]
    try:
        data: Any = json.loads(text)
    except ValueError:
        return []
    out: list[tuple[str, list[str]]] = []
    for job in data if isinstance(data, list) else [data]:
        if not isinstance(job, dict):
            continue
        custom = job.get("custom_attributes")
        executable = job.get("executable", custom.get("Executable")
                             if isinstance(custom, dict) else None)
        listed = job.get("input_sandbox")
        if isinstance(executable, str) and isinstance(listed, list):
            out.append((executable, [e for e in listed if isinstance(e, str)]))
    return out


def _unpacked_names(entries: list[str], base: Path) -> set[str]:
    """The paths in the job's folder that the local files ``entries`` become (as
    :func:`pack_local` names them)."""
    names: set[str] = set()
    for given in entries:
        name = local_path(given)
        path = Path(name) if os.path.isabs(name) else base / name
        names.add(path.name)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                for f in [*dirs, *files]:
                    names.add(f"{path.name}/{(Path(root) / f).relative_to(path).as_posix()}")
    return names


def jdl_input_sandboxes(text: str) -> list[tuple[int, int, list[str]]]:
    """Each top-level InputSandbox value of a JDL: its span in ``text`` and its entries."""
    return _jdl_values(text, "inputsandbox")


def _jdl_values(text: str, attribute: str) -> list[tuple[int, int, list[str]]]:
    """Each top-level value of ``attribute`` (lower case) in a JDL: its span and its
    entries."""
    tokens = [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)
              if not m.group().startswith(("//", "#", "/*"))]
    top = 1 if tokens and tokens[0][0] == "[" else 0
    found: list[tuple[int, int, list[str]]] = []
    depth = 0
    i = 0
    while i < len(tokens):
        word = tokens[i][0]
        if (depth == top and word.lower() == attribute and i + 2 < len(tokens)
                and tokens[i + 1][0] == "="):
            value = _sandbox_value(tokens, i + 2)
            if value is not None:
                found.append(value[:3])
                i = value[3]
                continue
        if word in "[{(" and len(word) == 1:
            depth += 1
        elif word in "]})" and len(word) == 1:
            depth -= 1
        i += 1
    return found


def _sandbox_value(tokens: list[tuple[str, int, int]], i: int
                   ) -> tuple[int, int, list[str], int] | None:
    """The value starting at token ``i``: a string, a word, or a list of them (span, entries,
    the token after it); None for anything else (the service will say what is wrong)."""
    first, start, end = tokens[i]
    if first != "{":
        return (start, end, [_text(first)], i + 1) if first not in "[]{}();=," else None
    entries: list[str] = []
    j = i + 1
    while j < len(tokens):
        token, _s, token_end = tokens[j]
        if token == "}":
            return start, token_end, entries, j + 1
        if token == ",":
            j += 1
            continue
        if len(token) == 1 and token in "[]{}();=":
            return None
        entries.append(_text(token))
        j += 1
    return None


def _text(token: str) -> str:
    """A string token's text, or a bare word as it is."""
    if token.startswith('"'):
        return _unquote(token[1:-1])
    return token


def _json_inputs(text: str, base: Path, store: Callable[[bytes], str]) -> str:
    data: Any = json.loads(text)
    jobs = data if isinstance(data, list) else [data]
    local: list[str] = []
    for job in jobs:
        if isinstance(job, dict) and isinstance(job.get("input_sandbox"), list):
            local += [e for e in job["input_sandbox"] if isinstance(e, str) and is_local(e)]
    if not local:
        return text
    sid = store(pack_local(list(dict.fromkeys(local)), base))
    for job in jobs:
        if isinstance(job, dict) and isinstance(job.get("input_sandbox"), list):
            kept = [e for e in job["input_sandbox"] if not (isinstance(e, str) and is_local(e))]
            job["input_sandbox"] = [*kept, sid]
    return json.dumps(data)


def _unquote(s: str) -> str:
    return s.replace('\\"', '"').replace("\\\\", "\\")


def fetch_output(service: Service, sandbox: str, dest: Path) -> list[str]:
    """Download a sandbox (following the object store's redirect) and unpack it into
    ``dest``; return the names written."""
    url = f"{service.url}/api/v1/sandboxes/{sandbox}"
    try:
        response = transfer.request(service.http, "GET", url, deadline=service.timeout,
                                    follow=False, max_bytes=MAX_DOWNLOAD_BYTES)
        if response.status_code in (301, 302, 303, 307, 308):  # the store's presigned URL
            response = transfer.request(tls.trusting(requests.Session(), service.http.verify),
                                        "GET", response.headers["Location"], follow=False,
                                        deadline=service.timeout, max_bytes=MAX_DOWNLOAD_BYTES)
    except (requests.RequestException, KeyError) as exc:
        raise ServiceError(0, f"the sandbox download failed: {exc}") from exc
    if response.status_code >= 400:
        raise ServiceError(response.status_code, f"sandbox {sandbox}: {response.text[:200]}")
    if hashlib.sha256(response.content).hexdigest() != sandbox.rpartition(":")[2]:
        raise ServiceError(0, f"sandbox {sandbox} arrived damaged (its sha256 differs)")
    try:
        return unpack(response.content, dest)
    except UnsafeArchiveError as exc:
        raise OutputFolderError(f"the output sandbox cannot be unpacked into {dest}: {exc}") \
            from exc
