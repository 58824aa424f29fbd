from __future__ import annotations

from pathlib import Path

import pytest

from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import DEFAULT_CPU_SEGMENTS, Settings, host_and_port, load_settings


def test_defaults_use_an_sqlite_file() -> None:
    s = load_settings(None, {})
    assert s.database.url.startswith("sqlite:///")
    assert s.taskqueue.cpu_time_segments == DEFAULT_CPU_SEGMENTS


def test_the_shipped_file_loads(repo_root: Path) -> None:
    s = load_settings(repo_root / "conf" / "gridpilot.toml", {})
    assert s.share_of("lhcb_prod") == 4.0
    assert s.group_shares_jobs("lhcb_prod") and not s.group_shares_jobs("lhcb_user")
    assert s.purge.retentions() == {"Done": 30, "Killed": 30, "Failed": 60, "Deleted": 1}


def test_a_retention_of_zero_keeps_that_status() -> None:
    s = load_settings(None, {"GRIDPILOT_PURGE_FAILED": "0", "GRIDPILOT_PURGE_DONE": "7"})
    assert s.purge.retentions() == {"Done": 7, "Killed": 30, "Deleted": 1}


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    f = tmp_path / "g.toml"
    f.write_text('[database]\nurl = "sqlite:///a.db"\n[taskqueue]\nempty_queue_grace = 5\n')
    s = load_settings(f, {"GRIDPILOT_DATABASE_URL": "sqlite:///b.db",
                          "GRIDPILOT_TASKQUEUE_SHARES": '{"g": 2}',
                          "GRIDPILOT_TASKQUEUE_JOB_SHARING_GROUPS": '["g"]'})
    assert s.database.url == "sqlite:///b.db"
    assert s.taskqueue.empty_queue_grace == 5
    assert s.share_of("g") == 2.0 and s.group_shares_jobs("g")


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(AttributeError):
        s.database = s.database  # type: ignore[misc]


@pytest.mark.parametrize(("text", "env", "message"), [
    ("[database]\nurl = 3\n", {}, "database.url must be a string, got 3"),
    ("[database]\nurll = 'x'\n", {}, "unknown key database.urll"),
    ("[nope]\n", {}, "unknown section or key nope"),
    ("database = 1\n", {}, r"\[database\] must be a table"),
    ("[taskqueue]\ncpu_time_segments = [10, 5]\n", {}, "strictly ascending"),
    ("[taskqueue.shares]\ng = -1\n", {}, "shares.g must be a positive number"),
    ("[taskqueue]\nempty_queue_grace = 'soon'\n", {}, "must be an integer, got 'soon'"),
    ("", {"GRIDPILOT_TASKQUEUE_EMPTY_QUEUE_GRACE": "x"},
     "environment variable GRIDPILOT_TASKQUEUE_EMPTY_QUEUE_GRACE must be an integer"),
    ("[database\n", {}, "is not valid TOML"),
    ("[database]\ntransaction_pooler = true\n", {},
     "transaction_pooler is for a PostgreSQL URL .* not for sqlite"),
    ("", {"GRIDPILOT_DATABASE_URL": "mysql+pymysql://root@db/gp",
          "GRIDPILOT_DATABASE_TRANSACTION_POOLER": "true"}, "not for mysql"),
    ("[agents]\nmetrics_bind = '9110'\n", {}, "agents.metrics_bind must be host:port"),
    ("[agents]\nmetrics_bind = '127.0.0.1:99999'\n", {}, "must be host:port"),
    ("[agents]\nmetrics_bind = 'http://127.0.0.1:9110'\n", {}, "must be host:port"),
    ("[agents]\nmetrics_bind = ' :9110'\n", {}, "must be host:port"),
    ("[purge]\nfailed = -1\n", {}, "purge.failed must not be negative, got -1"),
    ("[purge]\nbatch = 0\n", {}, "purge.batch must be at least 1, got 0"),
    ("[agents]\nce_turn_budget = 0\n", {}, "agents.ce_turn_budget must be at least 1 second"),
    ("[purge]\npause = -0.5\n", {}, "purge.pause must not be negative, got -0.5"),
    ("[matcher]\nread_timeout = 0\n", {}, "matcher.read_timeout must be above 0 seconds"),
    ("", {"GRIDPILOT_MATCHER_READ_TIMEOUT": "-1"}, "matcher.read_timeout must be above 0"),
])
def test_bad_settings_name_the_place(tmp_path: Path, text: str, env: dict[str, str],
                                     message: str) -> None:
    f = tmp_path / "g.toml"
    f.write_text(text)
    with pytest.raises(ConfigurationError, match=message):
        load_settings(f, env)


def test_addresses_the_agents_may_answer_at() -> None:
    assert host_and_port("127.0.0.1:9110", "x") == ("127.0.0.1", 9110)
    assert host_and_port("[::1]:9110", "x") == ("::1", 9110)
    assert host_and_port("agents.example.org:80", "x") == ("agents.example.org", 80)
    settings = load_settings(None, {"GRIDPILOT_AGENTS_METRICS_BIND": "0.0.0.0:9110",
                                    "GRIDPILOT_DATABASE_URL": "postgresql+psycopg://pgb/gp",
                                    "GRIDPILOT_DATABASE_TRANSACTION_POOLER": "true"})
    assert settings.agents.metrics_bind == "0.0.0.0:9110"
    assert settings.database.transaction_pooler


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_settings(tmp_path / "none.toml", {})


def test_relative_paths_in_a_file_count_from_its_folder(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    f = folder / "g.toml"
    f.write_text('[database]\nurl = "sqlite:///../var/g.db?timeout=5"\n'
                 '[resources]\nfile = "resources.toml"\n'
                 '[auth]\nsecret_file = "~/secret"\n'
                 '[matcher]\nmetrics_dir = "/var/metrics"\n'
                 '[agents]\npilot_workdir = "pilots"\n')
    monkeypatch.chdir(tmp_path)
    s = load_settings(Path("etc/g.toml"), {})
    assert s.database.url == f"sqlite:///{folder / '../var/g.db'}?timeout=5"
    assert s.resources.file == str(folder / "resources.toml")
    assert s.auth.secret_file == str(Path("~/secret").expanduser())
    assert s.matcher.metrics_dir == "/var/metrics"
    assert s.agents.pilot_workdir == str(folder / "pilots")
    # The environment's and the defaults' relative paths count from the current directory.
    env = load_settings(f, {"GRIDPILOT_RESOURCES_FILE": "here.toml",
                            "GRIDPILOT_DATABASE_URL": "sqlite:///g.db"})
    assert (env.resources.file, env.database.url) == ("here.toml", "sqlite:///g.db")
    assert load_settings(None, {}).resources.file == "conf/resources.toml"
    for url in ("sqlite:///:memory:", "sqlite:////abs/g.db", "postgresql+psycopg://h/db"):
        f.write_text(f'[database]\nurl = "{url}"\n')
        assert load_settings(f, {}).database.url == url


def test_the_shipped_file_names_files_beside_it(repo_root: Path) -> None:
    s = load_settings(repo_root / "conf" / "gridpilot.toml", {})
    assert Path(s.resources.file) == repo_root / "conf" / "resources.toml"
    assert Path(s.resources.file).is_file()
    assert Path(s.database.url.removeprefix("sqlite:///")).resolve() == \
        (repo_root / "work" / "gridpilot.db").resolve()


def test_matcher_threads_reach_gunicorn_and_must_be_positive(tmp_path: Path) -> None:
    from gridpilot.server import gunicorn_options

    settings = load_settings(None, {"GRIDPILOT_MATCHER_THREADS": "1"})
    assert gunicorn_options(settings)["threads"] == 1  # one request per worker at a time
    assert gunicorn_options(Settings())["threads"] == 4
    with pytest.raises(ConfigurationError, match=r"matcher\.threads must be at least 1"):
        load_settings(None, {"GRIDPILOT_MATCHER_THREADS": "0"})


def test_the_replica_catalogue_settings(tmp_path: Path) -> None:
    assert load_settings(None, {}).catalogue.backend == "database"
    with pytest.raises(ConfigurationError, match=r"catalogue\.backend must be database or rucio"):
        load_settings(None, {"GRIDPILOT_CATALOGUE_BACKEND": "lfc"})
    with pytest.raises(ConfigurationError, match=r"catalogue\.rucio_url must be set"):
        load_settings(None, {"GRIDPILOT_CATALOGUE_BACKEND": "rucio"})
    f = tmp_path / "g.toml"
    f.write_text('[catalogue]\nbackend = "rucio"\nrucio_url = "https://rucio.example.org"\n'
                 'rucio_account = "gridpilot"\nrucio_username = "gp"\n'
                 'rucio_password_file = "secrets/rucio"\n')
    s = load_settings(f, {})
    assert s.catalogue.rucio_password_file == str(tmp_path / "secrets" / "rucio")
    with pytest.raises(ConfigurationError, match=r"rucio_password_file .* cannot be read"):
        s.catalogue.rucio_password()
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "rucio").write_text("s3cret\n")
    assert s.catalogue.rucio_password() == "s3cret"


def test_matcher_ca_bundle_counts_from_the_files_folder_and_comes_from_the_environment(
        tmp_path: Path) -> None:
    assert load_settings(None, {}).matcher.ca_bundle == ""
    f = tmp_path / "etc" / "gridpilot.toml"
    f.parent.mkdir()
    f.write_text('[matcher]\nurl = "https://wms.example.org"\nca_bundle = "ca.pem"\n')
    assert load_settings(f, {}).matcher.ca_bundle == str(tmp_path / "etc" / "ca.pem")
    assert load_settings(f, {"GRIDPILOT_MATCHER_CA_BUNDLE": "/etc/ca.pem"}
                         ).matcher.ca_bundle == "/etc/ca.pem"
