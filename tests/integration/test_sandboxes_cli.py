"""``gridpilot sandboxes usage`` and ``cleanup``: the operator's view of the sandbox store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from pilot.archive import Member, pack, sandbox_id
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.files.sandboxes import Uploader, register_sandbox
from taskqueue.files.sandboxstore import LocalStore
from tests.integration.test_cli import run


def test_usage_and_cleanup(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    env = {"GRIDPILOT_DATABASE_URL": url, "GRIDPILOT_SANDBOXES_RETENTION": "3600"}
    assert run(["db", "upgrade"], tmp_path, **env).returncode == 0
    store = LocalStore(tmp_path / "sandboxes")  # beside the SQLite database: the default
    factory = make_session_factory(make_engine(url))
    now = datetime.now(UTC)
    sizes = {}
    for name, vo, age in (("a", "lhcb", 2), ("b", "lhcb", 0), ("c", "belle", 0)):
        data = pack([Member(name, name.encode() * 1000)])
        sid = sandbox_id(data)
        store.put(sid, data)
        sizes[name] = len(data)
        with factory.begin() as session:
            register_sandbox(session, sid, len(data), Uploader(vo, "u", f"{vo}_user"),
                             now=now - timedelta(hours=age))
    usage = run(["sandboxes", "usage"], tmp_path, **env)
    assert usage.returncode == 0, usage.stderr
    lines = {line.split()[0]: line.split()[1:] for line in usage.stdout.splitlines()[1:]}
    assert lines["lhcb"][0] == "2" and lines["belle"][0] == "1" and lines["total"][0] == "3"
    cleanup = run(["sandboxes", "cleanup"], tmp_path, **env)
    assert cleanup.returncode == 0, cleanup.stderr
    assert f"1 sandbox(es) removed, {sizes['a']} bytes freed" in cleanup.stdout
    assert len(list(store.keys())) == 2
    after = run(["sandboxes", "usage"], tmp_path, **env)
    assert [line.split()[:2] for line in after.stdout.splitlines()[1:]] == [
        ["belle", "1"], ["lhcb", "1"], ["total", "2"]]
