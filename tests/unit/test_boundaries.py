"""The package boundaries of docs/ARCHITECTURE.md, checked on the source and in a fresh
interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

#: Third-party and project modules each package may import (the standard library always).
ALLOWED: dict[str, set[str]] = {
    # boto3 only in the S3 sandbox store, imported when that backend is chosen;
    # cryptography: the payload tokens' ES256 keys (taskqueue/signingkeys.py).
    "taskqueue": {"taskqueue", "sqlalchemy", "boto3", "botocore", "cryptography"},
    # orjson: each job of a JSON bulk is written back as its own compact text; rucio: the
    # Rucio replica catalogue, imported only when chosen.
    "optimizers": {"optimizers", "taskqueue", "classad2", "orjson", "rucio"},
    "matcher": {"matcher", "taskqueue", "optimizers", "pilot", "flask", "werkzeug", "jwt",
                "prometheus_client", "orjson"},
    "pilot": {"pilot", "requests"},
    # The user's side: the wire format is the only part of the pilot package it may use.
    "client": {"client", "pilot", "requests", "click", "psij", "packaging"},
    # requests and cryptography: the ARC-CE REST client (agents/ce/arcrest.py);
    # prometheus_client: the agents' own metrics endpoint ([agents] metrics_bind).
    "agents": {"agents", "taskqueue", "optimizers", "psij", "requests", "cryptography",
               "prometheus_client"},
    "migrations": {"migrations", "taskqueue", "alembic", "sqlalchemy"},
    # The site simulator drives the pilot's own decision code and follows the matcher's rules
    # (taskqueue's CPU-time buckets; simulator.realqueue claims with the real claim code);
    # matplotlib draws its plots.
    "simulator": {"simulator", "pilot", "taskqueue", "sqlalchemy", "matplotlib"},
}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package: str) -> None:
    bad = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        extra = _imports(path) - STDLIB - ALLOWED[package]
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert bad == {}


def test_the_arc_client_imports_only_requests_and_cryptography() -> None:
    """The ARC-CE client and its helpers know nothing of the project's database or services."""
    bad = {}
    for name in ("arcrest", "adl", "x509proxy"):
        path = ROOT / "agents" / "ce" / f"{name}.py"
        used = {m for m in _modules_imported(path) if m.split(".")[0] not in STDLIB}
        extra = {m for m in used if m.split(".")[0] not in {"requests", "cryptography"}
                 and m != "agents.ce" and not m.startswith("agents.ce.")}
        if extra:
            bad[name] = sorted(extra)
    assert bad == {}


def test_nothing_imports_the_front_door() -> None:
    offenders = [str(p.relative_to(ROOT)) for pkg in ALLOWED for p in (ROOT / pkg).rglob("*.py")
                 if "gridpilot" in _imports(p)]
    assert offenders == []


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60, cwd=ROOT)
    return {m.split(".")[0] for m in out.stdout.split()}


def test_the_pilot_needs_no_server_library() -> None:
    loaded = _loaded_after("import pilot")
    assert not loaded & {"sqlalchemy", "flask", "alembic", "classad2", "psij", "click",
                         "taskqueue", "optimizers", "matcher", "agents", "gridpilot"}


def _modules_imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_client_takes_only_the_wire_format_from_the_pilot() -> None:
    used = {m for p in sorted((ROOT / "client").rglob("*.py")) for m in _modules_imported(p)
            if m.split(".")[0] == "pilot"}
    # ... and the sandbox archive format (packing and safe unpacking, standard library only).
    used = {m for m in used if m != "pilot.archive" and not m.startswith("pilot.archive.")}
    # ... and the transport (a deadline per request, a cap on answers, redirects kept at the
    # service's origin; standard library and requests only).
    used = {m for m in used if m != "pilot.transfer"}
    # ... and which CAs to trust for the service and what a failed verification says
    # (pilot.tls: the same sources and messages for both; standard library and requests).
    used = {m for m in used if m != "pilot.tls" and not m.startswith("pilot.tls.")}
    assert used <= {"pilot.protocol", "pilot.protocol.API_PREFIX"}, used


def test_the_client_needs_no_server_library() -> None:
    loaded = _loaded_after("import client.cli, client.service, client.config")
    assert {"requests", "click"} <= loaded
    assert not loaded & {"sqlalchemy", "flask", "alembic", "classad2", "psij", "jwt",
                         "taskqueue", "optimizers", "matcher", "agents", "gridpilot"}


def test_the_core_loads_no_web_or_cli_library() -> None:
    loaded = _loaded_after("import taskqueue.matching.claim, taskqueue.queues.taskqueues, "
                           "taskqueue.queues.submitpools")
    assert "sqlalchemy" in loaded
    assert not loaded & {"flask", "requests", "click", "alembic", "optimizers", "matcher",
                         "agents", "gridpilot"}
