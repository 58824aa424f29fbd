"""An installed (not editable) gridpilot serves the dashboard's templates and static files:
they ship as package data; and PSI/J finds its executor into gridpilot there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys, matcher
from pathlib import Path
assert Path(matcher.__file__).is_relative_to(sys.argv[1]), matcher.__file__
from matcher.app import create_app
from taskqueue.core.settings import Settings, AuthSettings
app = create_app(Settings(auth=AuthSettings(secret="Pk9dT-2xQm7vLr4ZsW8aNc1yHf6bJe3uGo5iKt0pVqE")))
client = app.test_client()
login = client.get("/ui/login")
assert login.status_code == 200 and b"Sign in to the dashboard" in login.data, login.data[:300]
for name in ("dashboard.css", "dashboard.js", "favicon.svg"):
    response = client.get(f"/ui/static/{name}")
    assert response.status_code == 200 and response.data, name
    response.close()
print("served from", Path(matcher.__file__).parent)
"""

PSIJ_PROBE = """
import sys, psij
(entry,) = psij.JobExecutor._executors["gridpilot"]
assert entry.plugin_path.startswith(sys.argv[1]), entry.plugin_path
from client.psij_executor import GridpilotExecutorConfig
executor = psij.JobExecutor.get_instance(
    "gridpilot", url="http://127.0.0.1:9", config=GridpilotExecutorConfig(token="t"))
print("executor", executor.name, entry.plugin_path)
"""


def test_an_installed_package_serves_the_dashboard(tmp_path: Path) -> None:
    target = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--target", str(target), str(ROOT)],
        capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    assert (target / "matcher" / "dashboard" / "templates" / "ui" / "overview.html").is_file()
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", PROBE, str(target)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert str(target) in out.stdout
    assert (target / "psij-descriptors" / "gridpilot_descriptor.py").is_file()
    found = subprocess.run([sys.executable, "-c", PSIJ_PROBE, str(target)], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    assert f"executor gridpilot {target}" in found.stdout
    # The example configuration ships too (gridpilot config example).
    example = subprocess.run(
        [sys.executable, "-c", "import gridpilot.examples as e; "
         "print(e.example_text('gridpilot')); print(e.example_text('resources'))"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert example.returncode == 0, example.stderr
    assert "[database]" in example.stdout and "[auth]" in example.stdout
    assert (target / "share" / "gridpilot" / "gridpilot.toml").is_file()
