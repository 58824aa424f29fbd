"""tools/pg-ha's choices that need no cluster: how many etcd members, and what it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PG_HA = ROOT / "tools" / "pg-ha"


def _module() -> ModuleType:
    loader = SourceFileLoader("pg_ha", str(PG_HA))
    module = ModuleType(loader.name)
    module.__file__ = str(PG_HA)
    loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PG_HA), *args], capture_output=True, text=True,
                          timeout=60)


def test_a_state_without_a_count_has_one_etcd_member(tmp_path: Path) -> None:
    pg_ha = _module()
    cluster = pg_ha.Cluster(tmp_path, Path("/nonexistent"))
    assert cluster.services({"ports": {}}) == ("etcd", "pg1", "pg2", "haproxy")
    assert cluster.services({"ports": {}, "etcd_members": 3}) == (
        "etcd", "etcd2", "etcd3", "pg1", "pg2", "haproxy")


def test_an_etcd_count_other_than_one_or_three_is_refused() -> None:
    done = _run("up", "--etcd-members", "2", "--dir", "/nonexistent")
    assert done.returncode == 2
    assert "--etcd-members: invalid choice: 2" in done.stderr


def test_another_etcd_count_on_a_cluster_is_refused(tmp_path: Path) -> None:
    """Its ports were chosen for the members it has: the cluster is not changed under its
    clients, the person is told to bring it down first."""
    if not Path("/usr/lib/postgresql/15/bin/postgres").exists():
        pytest.skip("no PostgreSQL 15 server here")
    folder = tmp_path / "ha"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps(
        {"ports": {"etcd": 1, "etcd-peer": 2}, "pids": {}, "etcd_members": 1}))
    done = _run("up", "--etcd-members", "3", "--dir", str(folder))
    assert done.returncode == 1, done.stderr
    assert "runs 1 etcd member(s), not 3: tools/pg-ha down first" in done.stderr
    assert "Traceback" not in done.stderr
