"""Fixtures of the reliability suite: fast client options, a loopback server, harvester
rows, and a `dagster dev` (webserver + daemon with the queued run coordinator) in its own
process group for the load test."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.oai import ClientOptions
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.conftest import PG_URL, REPO_ROOT, require_postgres
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

# Tiny backoff so a retried fault costs milliseconds, not seconds.
FAST = ClientOptions(max_retries=3, backoff_base=0.01, backoff_max=0.05, read_timeout=5,
                     connect_timeout=2)
RECORDS = 1000
PAGE = 100


def harvester(server: OAIServer, **fields: object) -> Harvester:
    """A harvester row (not registered) for `server`."""
    return Harvester(id=str(fields.pop("id", "r")), base_url=server.base_url,
                     metadata_prefix=str(fields.pop("metadata_prefix", "oai_dc")), **fields)


def assert_consistent(store: Store, harvester_id: str, expected: dict) -> dict:
    """Whatever the store holds is exactly the server's data for those identifiers."""
    snap = store.snapshot(harvester_id)
    wrong = {k: v for k, v in snap.items() if expected.get(k) != v}
    assert not wrong, f"store differs from the server for {len(wrong)} records: {list(wrong)[:5]}"
    return snap


@pytest.fixture
def server() -> Iterator[OAIServer]:
    """1000 records (5% deleted) in pages of 100 on 127.0.0.1."""
    with OAIServer(make_dataset(RECORDS, seed=11, deleted_ratio=0.05), page_size=PAGE) as srv:
        yield srv


@pytest.fixture
def store(database_url: str) -> Store:
    """A store on the parametrized database (SQLite and PostgreSQL)."""
    return Store()


# -- dagster dev -------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class DagsterDev:
    """A running `dagster dev`: its GraphQL port, home and process (group leader)."""

    port: int
    home: Path
    proc: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _wait(predicate: Callable[[], bool], timeout: float, what: str, dev: DagsterDev | None = None,
          interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if dev is not None and dev.proc.poll() is not None:
            raise AssertionError(f"dagster dev exited ({dev.proc.returncode}) while waiting for "
                                 f"{what}:\n{dev.log_tail()}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                         + (f":\n{dev.log_tail()}" if dev else ""))


def postgres_storage_yaml(url: str) -> str:
    """The `storage:` block of dagster.yaml for dagster-postgres on database `url`."""
    u = sa.engine.make_url(url)
    lines = ["storage:", "  postgres:", "    postgres_db:",
             f"      username: {u.username or 'postgres'}",
             f"      hostname: {u.host or '127.0.0.1'}",
             f"      db_name: {u.database}",
             f"      port: {u.port or 5432}",
             # SQLAlchemy 2.1 otherwise looks for psycopg 3 (DESIGN.md, known traps).
             "      scheme: postgresql+psycopg2"]
    if u.password:
        lines.insert(4, f"      password: {u.password}")
    return "\n".join(lines) + "\n"


def start_dagster_dev(tmp: Path, database_url: str, extra_yaml: str = "",
                      timeout: float = 120) -> DagsterDev:
    """Start `dagster dev` on a free port with a fresh $DAGSTER_HOME holding the repo's
    dagster.yaml (+ `extra_yaml`); wait until the code location has loaded."""
    home = tmp / "dagster_home"
    home.mkdir(exist_ok=True)
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    if extra_yaml:
        with open(home / "dagster.yaml", "a") as f:
            f.write("\n" + extra_yaml)
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "OAIPMH_DATABASE_URL": database_url,
           "PYTHONUNBUFFERED": "1"}
    env.pop("OAIPMH_DAGSTER_WEBSERVER", None)
    log_path = tmp / "dagster_dev.log"
    exe = Path(sys.executable).with_name("dagster")
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [str(exe), "dev", "-w", str(REPO_ROOT / "workspace.yaml"), "-h", "127.0.0.1",
             "-p", str(port)],
            cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    dev = DagsterDev(port, home, proc, log_path)
    try:
        _wait(lambda: _location_loaded(dev), timeout, "the code location to load", dev)
    except BaseException:
        stop_dagster_dev(dev)
        raise
    return dev


def _location_loaded(dev: DagsterDev) -> bool:
    query = ("{ workspaceOrError { ... on Workspace { locationEntries { name "
             "locationOrLoadError { __typename } } } } }")
    try:
        resp = httpx.post(f"{dev.url}/graphql", json={"query": query}, timeout=5)
        entries = resp.json()["data"]["workspaceOrError"]["locationEntries"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return False
    if not entries:
        return False
    kinds = {e["locationOrLoadError"]["__typename"] for e in entries if e["locationOrLoadError"]}
    if "PythonError" in kinds:
        raise AssertionError(f"code location failed to load:\n{dev.log_tail()}")
    return kinds == {"RepositoryLocation"}


def stop_dagster_dev(dev: DagsterDev) -> None:
    """End the whole process group (webserver, daemon, code servers, run workers)."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(dev.proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(dev.proc.pid, 0)
            except ProcessLookupError:
                break
            dev.proc.poll()
            time.sleep(0.2)
        else:
            continue
        break
    with contextlib.suppress(subprocess.TimeoutExpired):
        dev.proc.wait(timeout=10)


def fresh_postgres_database() -> tuple[str, Callable[[], None]]:
    """A new, empty PostgreSQL database and a function that drops it."""
    require_postgres()
    name = f"oaipmh_rel_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(PG_URL).set(database=name).render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name})
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()

    return url, drop
