"""The client's side of sandboxes: before a description is submitted, the local files its
InputSandbox lists are packed into one archive, uploaded (unless the service has it already)
and replaced by the sandbox id; and a job's output sandbox is fetched and unpacked.

Entries that are sandbox ids, ``LFN:`` names or parametric templates (``%s``) are left as
they are. Relative names are read from the folder of the description file; the archive
holds each file under its own name (a folder with everything in it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from client.service import Service, ServiceError
from pilot.archive import Member, is_sandbox_id, pack, unpack

#: ``InputSandbox = {"a", "b"}`` or ``InputSandbox = "a"`` in a JDL (any letter case).
_JDL_INPUT = re.compile(r'(?i)(\bInputSandbox\s*=\s*)(\{[^{}]*\}|"(?:[^"\\]|\\.)*")')
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


class SandboxFileError(ValueError):
    """A local file of the InputSandbox cannot be read; the message names it."""


def is_local(entry: str) -> bool:
    return not (is_sandbox_id(entry) or entry[:4].upper() == "LFN:" or "%" in entry)


def pack_local(names: list[str], base: Path) -> bytes:
    """One archive of the local files (and folders) ``names``, read relative to ``base``."""
    members: dict[str, Member] = {}
    for name in names:
        path = Path(name) if os.path.isabs(name) else base / name
        if path.is_dir():
            for root, _dirs, files in os.walk(path):
                for f in sorted(files):
                    full = Path(root) / f
                    arc = f"{path.name}/{full.relative_to(path).as_posix()}"
                    members[arc] = _member(arc, full, name)
        else:
            members[path.name] = _member(path.name, path, name)
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
            http = service.http if ours else requests.Session()
            response = http.put(url, data=data, headers=headers, timeout=service.timeout)
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
    match = list(_JDL_INPUT.finditer(text))
    if not match:
        return text
    entries = [_unquote(s) for m in match for s in _STRING.findall(m.group(2))]
    local = [e for e in entries if is_local(e)]
    if not local:
        return text
    sid = store(pack_local(local, base))

    def rewrite(m: re.Match[str]) -> str:
        kept = [e for e in (_unquote(s) for s in _STRING.findall(m.group(2)))
                if not is_local(e)]
        return m.group(1) + "{" + ", ".join(json.dumps(e) for e in [*kept, sid]) + "}"

    return _JDL_INPUT.sub(rewrite, text)


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
        response = service.http.get(url, timeout=service.timeout, allow_redirects=False)
        if response.status_code in (301, 302, 303, 307, 308):
            response = requests.get(response.headers["Location"], timeout=service.timeout)
    except (requests.RequestException, KeyError) as exc:
        raise ServiceError(0, f"the sandbox download failed: {exc}") from exc
    if response.status_code >= 400:
        raise ServiceError(response.status_code, f"sandbox {sandbox}: {response.text[:200]}")
    if hashlib.sha256(response.content).hexdigest() != sandbox.rpartition(":")[2]:
        raise ServiceError(0, f"sandbox {sandbox} arrived damaged (its sha256 differs)")
    return unpack(response.content, dest)
