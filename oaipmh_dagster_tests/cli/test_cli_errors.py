"""Every bad input and every failure of the `oaipmh-dagster` command is one line on stderr
(`oaipmh-dagster: error: ...`), exit 2 (usage) or 1 (failure); tracebacks go to the run's
event log, or to stderr with `--verbose` (both databases; real processes where it matters)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster_tests.conftest import ERROR, REPO_ROOT, Result


def run_process(*argv: str, timeout: float = 120) -> Result:
    """The command as a real process (Dagster's own loggers and warnings included)."""
    done = subprocess.run([sys.executable, "-m", "oaipmh_dagster.cli", *argv],
                          capture_output=True, text=True, timeout=timeout, env=os.environ.copy(),
                          check=False)
    return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def shipped_home(_isolated_home: Path) -> Path:
    """The Dagster home as set up for the project: with the shipped dagster.yaml (telemetry
    off, so Dagster prints no first-run notice of its own)."""
    shutil.copy(REPO_ROOT / "dagster.yaml", _isolated_home / "dagster.yaml")
    return _isolated_home


@pytest.fixture
def unreachable(database_url: str, closed_port_url: str, shipped_home: Path) -> Harvester:
    """Harvester `demo` whose endpoint refuses connections (no retries: fails at once)."""
    return Registry(db.get_engine()).add(Harvester(
        id="demo", base_url=closed_port_url, metadata_prefix="oai_dc", max_retries=0,
        timeout=5))


def runs() -> list:
    return dg.DagsterInstance.get().get_runs()


# -- harvest: dates and other run config checked before a run exists --------------------


@pytest.mark.parametrize(("argv", "needle"), [
    (["--since", "9999-12-31T23:59:59-14:00"], "--since"),  # overflows when made UTC
    (["--since", "0001-01-01T00:00:00+14:00"], "--since"),
    (["--until", "9999-12-31T23:59:59-14:00"], "--until"),
    (["--since", "10000-01-01"], "--since"),
    (["--since", "2024-02-30"], "--since"),
    (["--since", "2024-01-02", "--until", "2024-01-01"], "after"),
    (["--set", "a b"], "set"),
    (["--oai-id", ""], "identifier"),
    (["--full", "--since", "2024-01-01"], "exclude"),
])
def test_harvest_bad_run_config(run, unreachable: Harvester, argv: list[str],
                                needle: str) -> None:
    r = run("harvest", "demo", *argv)
    assert r.code == 2
    assert needle in r.error_line
    assert r.out == ""
    assert runs() == []  # refused before any run was made


def test_harvest_overflowing_date_in_a_process(unreachable: Harvester) -> None:
    r = run_process("harvest", "demo", "--since", "9999-12-31T23:59:59-14:00")
    assert r.code == 2
    assert "out of range" in r.error_line


def test_harvest_unknown_id(run, database_url: str) -> None:
    r = run("harvest", "nope")
    assert r.code == 1 and "nope" in r.error_line


# -- harvest: a failed run -------------------------------------------------------------


def test_a_retried_harvest_says_so(run, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transient failure retried in the same run prints one line (cause, retry n of m,
    the wait) instead of waiting in silence; the run then succeeds."""
    from oaipmh_dagster.demo.dataset import make_dataset
    from oaipmh_dagster_tests.helpers import add_harvester
    from oaipmh_dagster_tests.oaiserver import FaultyOAIServer

    monkeypatch.setenv("OAIPMH_OP_RETRIES", "2")
    monkeypatch.setenv("OAIPMH_OP_RETRY_DELAY", "0")
    with FaultyOAIServer(make_dataset(20, seed=5), page_size=10) as srv:
        add_harvester("wobbly", srv.base_url, max_retries=0)
        srv.faults.add("status", verb="ListRecords", page=2, status=503)
        r = run("harvest", "wobbly")
    assert r.code == 0, r.err
    retried = [line for line in r.err.splitlines() if "retry 1 of 2" in line]
    assert len(retried) == 1 and "503" in retried[0]
    assert "succeeded" in r.out + r.err


def test_failed_harvest_is_one_line(run, unreachable: Harvester) -> None:
    r = run("harvest", "demo")
    assert r.code == 1
    line = r.error_line
    assert "failed" in line and "Connection refused" in line
    assert "--verbose" in line
    run_id = re.search(r"run ([0-9a-f-]{36}) failed", line)[1]
    # The full traceback is in the run's event log.
    failures = [e for e in dg.DagsterInstance.get().all_logs(run_id)
                if e.dagster_event is not None and e.dagster_event.is_step_failure]
    assert failures
    error = failures[0].dagster_event.event_specific_data.error
    assert "Connection refused" in error.to_string() and "client.py" in error.to_string()


def test_failed_harvest_in_a_process(unreachable: Harvester) -> None:
    r = run_process("harvest", "demo")
    assert r.code == 1
    assert "Connection refused" in r.error_line


def test_failed_harvest_verbose(unreachable: Harvester) -> None:
    r = run_process("--verbose", "harvest", "demo")
    assert r.code == 1
    lines = r.err.splitlines()
    assert len(lines) > 5
    assert "STEP_FAILURE" in r.err and "client.py" in r.err  # Dagster's log, with stack
    assert lines[-1].startswith(ERROR) and "Connection refused" in lines[-1]
    assert [line for line in lines if line.startswith(ERROR)] == [lines[-1]]


# -- records ---------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["-1", "x"])
def test_records_bad_limit(run, database_url: str, limit: str) -> None:
    r = run("records", "demo", "--limit", limit)
    assert r.code == 2
    assert "--limit" in r.error_line
    assert r.out == ""


# -- an unexpected error ---------------------------------------------------------------


def test_unexpected_error_is_one_line(run, database_url: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Registry) -> list:
        raise RuntimeError("something broke\nover two lines")

    monkeypatch.setattr(Registry, "list_rows", broken)
    r = run("harvester", "list")
    assert r.code == 1
    assert "something broke over two lines" in r.error_line
    r = run("--verbose", "harvester", "list")
    assert r.code == 1
    assert "Traceback" in r.err and "list_rows" in r.err
    assert r.err.splitlines()[-1].startswith(ERROR)


# -- broken databases, for every command that opens one --------------------------------


def _unknown_revision(tmp_path: Path) -> str:
    path = tmp_path / "newer.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE {db.VERSION_TABLE} (version_num VARCHAR(32))")
        conn.execute(f"INSERT INTO {db.VERSION_TABLE} VALUES ('f00dfeed')")  # noqa: S608
    return f"sqlite:///{path}"


def _not_a_database(tmp_path: Path) -> str:
    path = tmp_path / "garbage.sqlite"
    path.write_bytes(b"this is not a database file at all" * 100)
    return f"sqlite:///{path}"


def _closed_port(tmp_path: Path) -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"postgresql+psycopg2://postgres@127.0.0.1:{port}/test"


BROKEN_DATABASES = {
    "unreachable": _closed_port,
    "missing directory": lambda tmp_path: f"sqlite:///{tmp_path}/no/such/dir/x.sqlite",
    "not a database": _not_a_database,
    "unknown schema revision": _unknown_revision,
    "unparseable URL": lambda tmp_path: "not a url",
    "unknown driver": lambda tmp_path: "nosuchdialect://x/y",
}

COMMANDS = [
    ["init"],
    ["harvester", "list"],
    ["harvester", "show", "demo"],
    ["harvester", "add", "demo", "--url", "http://127.0.0.1:9/oai", "--prefix", "oai_dc",
     "--no-check"],
    ["harvester", "remove", "demo", "--yes"],
    ["harvest", "demo"],
    ["records", "demo"],
    ["export", "demo", "--format", "csv", "--output", "{out}"],
    ["serve", "--port", "0"],
]


@pytest.mark.parametrize("broken", list(BROKEN_DATABASES))
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: "-".join(argv[:2]))
def test_broken_database(run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str,
                         argv: list[str]) -> None:
    monkeypatch.setenv(db.DATABASE_URL_ENV, BROKEN_DATABASES[broken](tmp_path))
    out = tmp_path / "export.csv"
    try:
        r = run(*[a.replace("{out}", str(out)) for a in argv])
    finally:
        db.dispose_all()
    assert r.code == 1
    assert "database" in r.error_line
    assert not out.exists()


def test_broken_database_in_a_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(db.DATABASE_URL_ENV, _unknown_revision(tmp_path))
    r = run_process("harvester", "list")
    assert r.code == 1
    assert "f00dfeed" in r.error_line


# -- a Dagster home without dagster.yaml (the default ./.dagster_home) --------------------


def test_failed_harvest_in_a_bare_home(database_url: str, closed_port_url: str,
                                       _isolated_home: Path) -> None:
    """Dagster's advice about a missing dagster.yaml is no error: not on stderr either
    (its one-time telemetry notice is taken as already shown)."""
    Registry(db.get_engine()).add(Harvester(id="demo", base_url=closed_port_url,
                                            metadata_prefix="oai_dc", max_retries=0))
    (_isolated_home / ".telemetry").mkdir()
    (_isolated_home / ".telemetry" / "id.yaml").write_text("instance_id: test\n")
    r = run_process("harvest", "demo")
    assert r.code == 1
    assert "Connection refused" in r.error_line


# -- more bad input --------------------------------------------------------------------


def test_export_to_an_empty_path(run, database_url: str) -> None:
    r = run("export", "demo", "--format", "csv", "--output", "")
    assert r.code == 2
    assert "empty" in r.error_line


@pytest.mark.parametrize(("argv", "needle"), [
    (["--records", "-5"], "--records"),
    (["--records", "0"], "--records"),
    (["--port", "99999"], "--port"),
    (["--port", "0"], "--port"),
    (["--oai-port", "70000"], "--oai-port"),
])
def test_demo_bad_input(run, database_url: str, argv: list[str], needle: str) -> None:
    # Every case also names an impossible port, so nothing starts on a fixed one.
    extra = [] if "--oai-port" in argv else ["--oai-port", "70000"]
    r = run("demo", "--no-ui", *argv, *extra)
    assert r.code == 2
    assert needle in r.error_line
    assert r.out == ""
