"""The files of deploy/ hold: Prometheus's rules pass `promtool check rules` and their unit
tests, the example configuration `promtool check config`; the systemd units pass
`systemd-analyze verify` and its offline security review; every GRIDPILOT_* variable the
units, the example environment file and the Containerfile set is a setting that exists and
takes the value given; the Containerfile copies every package; the Grafana dashboard's
queries name only series gridpilot, its rules and HAProxy make (they run on a live Prometheus
in tests/integration/test_topology.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from matcher.metrics import HELP
from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = ("gridpilot-matcher.service", "gridpilot-agents.service")


def _command(name: str) -> str:
    """A command of Debian's packages, installed by tools/topology when missing (as root)."""
    found = shutil.which(name)
    if found is None and os.geteuid() == 0:
        subprocess.run([sys.executable, str(ROOT / "tools" / "topology"), "install"],
                       check=True, capture_output=True, timeout=900)
        found = shutil.which(name)
    if found is None:
        message = f"{name} is not installed (tools/topology install, as root)"
        if os.environ.get("GRIDPILOT_TEST_REQUIRE_SERVERS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


def test_the_rules_pass_promtools_checks_and_their_unit_tests() -> None:
    promtool = _command("promtool")
    rules = DEPLOY / "prometheus"
    check = subprocess.run([promtool, "check", "rules", "gridpilot-rules.yml"], cwd=rules,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout
    tested = subprocess.run([promtool, "test", "rules", "gridpilot-rules.test.yml"],
                            cwd=rules, capture_output=True, text=True, timeout=300)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert of the file has a test of its own.
    alerts = set(re.findall(r"^\s+- alert: (\w+)$",
                            (rules / "gridpilot-rules.yml").read_text(), re.M))
    tests = set(re.findall(r"^\s+alertname: (\w+)$",
                           (rules / "gridpilot-rules.test.yml").read_text(), re.M))
    assert len(alerts) >= 12 and alerts == tests


def test_the_example_prometheus_configuration_is_valid(tmp_path: Path) -> None:
    promtool = _command("promtool")
    for name in ("prometheus.yml", "gridpilot-rules.yml"):
        shutil.copy(DEPLOY / "prometheus" / name, tmp_path / name)
    (tmp_path / "gridpilot-metrics.token").write_text("t" * 40)
    (tmp_path / "haproxy-stats.password").write_text("p" * 32)
    check = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("unit", UNITS)
def test_the_units_verify_and_are_hardened(unit: str, tmp_path: Path) -> None:
    analyze = _command("systemd-analyze")
    text = (DEPLOY / "systemd" / unit).read_text()
    for option in ("NoNewPrivileges=yes", "ProtectSystem=strict", "User=gridpilot",
                   "CapabilityBoundingSet=\n", "PrivateTmp=yes"):
        assert option in text, option
    # verify checks that ExecStart's program exists: this test's own gridpilot stands in.
    gridpilot = Path(sys.executable).parent / "gridpilot"
    copy = tmp_path / unit
    copy.write_text(text.replace("/opt/gridpilot/bin/gridpilot", str(gridpilot)))
    verified = subprocess.run([analyze, "verify", "--man=no", str(copy)],
                              capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr
    # An overall exposure of at most 2.0 ("OK"): the threshold counts tenths.
    review = subprocess.run([analyze, "security", "--offline=yes", "--threshold=20",
                             str(copy)], capture_output=True, text=True, timeout=120)
    assert review.returncode == 0, review.stdout[-2000:] + review.stderr


def test_the_sysusers_file_makes_the_units_user() -> None:
    line = (DEPLOY / "systemd" / "gridpilot.sysusers.conf").read_text().splitlines()[-1]
    assert line.split()[:2] == ["u", "gridpilot"]


def _settings_named() -> dict[str, tuple[str, str]]:
    """GRIDPILOT_<SECTION>_<KEY> → (section, key) for every setting."""
    out = {}
    for section in dataclasses.fields(Settings):
        cls = section.type if isinstance(section.type, type) else type(
            getattr(Settings(), section.name))
        for key in dataclasses.fields(cls):
            out[f"GRIDPILOT_{section.name}_{key.name}".upper()] = (section.name, key.name)
    return out


def _assignments() -> dict[str, list[tuple[str, str]]]:
    """Every GRIDPILOT_* variable the deployment files set, with its value, per file."""
    found: dict[str, list[tuple[str, str]]] = {}
    for path in [*(DEPLOY / "systemd").iterdir(), DEPLOY / "Containerfile"]:
        text = path.read_text().replace("\\\n", "\n")
        pairs = re.findall(r"^\s*(?:Environment=|ENV\s+)?(GRIDPILOT_[A-Z_]+)=(.*?)\s*$",
                           text, re.M)
        found[path.name] = pairs
    return found


def _filled_in(value: str) -> str:
    """``value`` with its placeholders replaced by real secrets, as an operator does."""
    return re.sub(r"CHANGE-ME[-A-Z0-9]*", lambda _: secrets.token_urlsafe(32), value)


def test_every_variable_set_is_a_setting_that_takes_its_value() -> None:
    named = _settings_named()
    everything = _assignments()
    assert everything["Containerfile"] and everything["gridpilot.env.example"]
    for file, pairs in everything.items():
        for name, value in pairs:
            if name == "GRIDPILOT_CONFIG":  # the settings file itself (gridpilot --config)
                continue
            assert name in named, f"{file}: {name} is no setting"
            section, key = named[name]
            environ = {name: _filled_in(value)}
            if name == "GRIDPILOT_DATABASE_TRANSACTION_POOLER":
                environ["GRIDPILOT_DATABASE_URL"] = "postgresql+psycopg://pgbouncer/gp"
            settings = load_settings(None, environ)
            got = getattr(getattr(settings, section), key)
            assert got not in (None, ""), f"{file}: {name}={value} left {section}.{key} empty"


def test_the_example_environment_file_loads_whole() -> None:
    pairs = dict(_assignments()["gridpilot.env.example"])
    with pytest.raises(ConfigurationError, match="placeholder"):
        load_settings(None, pairs)  # as shipped
    settings = load_settings(None, {name: _filled_in(value) for name, value in pairs.items()})
    assert settings.database.transaction_pooler
    assert settings.matcher.trusted_proxies == ("10.1.0.5", "10.1.0.6")
    assert settings.matcher.url.startswith("https://")


def test_the_containerfile_copies_every_package() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    copied = set(re.findall(r"^COPY (?!--from)(\S+) ", text, re.M))
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
    setup = (ROOT / "setup.cfg").read_text()
    block = setup.split("[options.packages.find]")[1].split("\n[")[0]
    packages = {line.strip().rstrip("*") for line in block.splitlines()
                if line.startswith("    ") and not line.strip().startswith("#")}
    assert packages and packages <= copied, packages - copied
    assert re.search(r"^USER 10001", text, re.M)
    assert 'ENTRYPOINT ["gridpilot"]' in text


#: Series Prometheus has besides gridpilot's: its own and HAProxy's.
_FOREIGN = ("up", "ALERTS", "time", "vector", "haproxy_server_status",
            "haproxy_frontend_http_responses_total")


def test_the_dashboard_asks_only_for_series_that_exist() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "gridpilot.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    rules = (DEPLOY / "prometheus" / "gridpilot-rules.yml").read_text()
    known = (set(HELP) | set(re.findall(r"record: (\S+)", rules))
             | set(re.findall(r'"(gridpilot_\w+)"', (ROOT / "agents" / "metrics.py").read_text())))
    counters = {name.removesuffix("_total") for name in known}
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = re.sub(r'"[^"]*"', '""', target["expr"])  # not in label values
            for name in re.findall(r"[a-z_:]*gridpilot[a-z0-9_:]*", names):
                base = re.sub(r"_(bucket|count|sum|total)$", "", name)
                assert name in known or base in known or base in counters, (
                    f"{panel['title']}: {name} is not a series gridpilot makes")
    used = " ".join(t["expr"] for p in panels for t in p["targets"])
    for name in ("haproxy_server_status", "haproxy_frontend_http_responses_total", "ALERTS"):
        assert name in used and name in _FOREIGN
