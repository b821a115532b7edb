"""A real `dagster dev` (webserver + daemon) on 127.0.0.1 with a temporary DAGSTER_HOME,
on SQLite or PostgreSQL storage; its process group is always torn down."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml

from oaipmh_dagster.storage import db
from oaipmh_dagster_tests.conftest import PG_URL, REPO_ROOT, drop_database, require_postgres

LOCATION = "oaipmh_dagster"
REPOSITORY = "__repository__"
STARTUP_TIMEOUT = 180.0
TERM_TIMEOUT = 20.0
SENSOR_INTERVAL = 5  # seconds between the since sensor's ticks under test
DAGSTER = Path(sys.executable).with_name("dagster")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 1.0,
              on_timeout: Callable[[], str] = lambda: "") -> Any:
    """Call `probe` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})\n"
                f"{on_timeout()}")


@dataclass
class Storage:
    """Where Dagster and the harvester database keep their state for one session."""

    kind: str  # sqlite | postgres
    home: Path
    database_url: str
    instance_yaml: dict[str, Any]
    cleanups: list[Callable[[], None]] = field(default_factory=list)


def _postgres_storage(home: Path) -> Storage:
    """A fresh PostgreSQL database (created here, dropped by the cleanups) holding both
    Dagster's storage and the harvester tables."""
    require_postgres()
    name = f"oaipmh_e2e_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(PG_URL).set(database=name)

    def drop() -> None:
        drop_database(admin, name)

    config = {
        "postgres_db": {
            "hostname": url.host or "127.0.0.1",
            "username": url.username or "postgres",
            "password": url.password or "",
            "db_name": name,
            "port": url.port or 5432,
            "scheme": "postgresql+psycopg2",
        }
    }
    shipped = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    return Storage("postgres", home, url.render_as_string(hide_password=False),
                   {**shipped, "storage": {"postgres": config}}, [drop])


def make_storage(kind: str, tmp: Path) -> Storage:
    home = tmp / "e2e_dagster_home"
    home.mkdir()
    if kind == "postgres":
        storage = _postgres_storage(home)
    else:
        storage = Storage("sqlite", home, f"sqlite:///{tmp / 'oaipmh.sqlite'}",
                          yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text()))
    if kind == "sqlite":
        shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    else:
        (home / "dagster.yaml").write_text(yaml.safe_dump(storage.instance_yaml))
    return storage


@dataclass
class DagsterDev:
    """A running `dagster dev`: GraphQL, the instance it writes to, its log."""

    storage: Storage
    port: int
    process: subprocess.Popen
    log_path: Path
    _instance: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment of the server and of CLI calls made against it."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OAIPMH_", "DAGSTER_"))}
        env.update(DAGSTER_HOME=str(self.storage.home),
                   OAIPMH_DATABASE_URL=self.storage.database_url,
                   OAIPMH_DAGSTER_WEBSERVER=self.url,
                   OAIPMH_OP_RETRIES="0",  # a run failed on purpose fails at once
                   # the daemon's since sensor ticks every 5 s, not once a minute
                   OAIPMH_SINCE_SENSOR_INTERVAL=str(SENSOR_INTERVAL),
                   PYTHONUNBUFFERED="1")
        return env

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "--- dagster dev log (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def graphql(self, query: str, variables: dict[str, Any] | None = None,
                timeout: float = 60.0) -> dict[str, Any]:
        resp = httpx.post(f"{self.url}/graphql",
                          json={"query": query, "variables": variables or {}},
                          timeout=httpx.Timeout(timeout, connect=5.0))
        resp.raise_for_status()
        body = resp.json()
        assert not body.get("errors"), f"GraphQL errors: {body['errors']}"
        return body["data"]

    def instance(self):  # noqa: ANN201 - DagsterInstance, imported lazily
        """The Dagster instance of DAGSTER_HOME, opened in the test process."""
        if self._instance is None:
            from dagster import DagsterInstance
            from dagster._core.instance.ref import InstanceRef

            self._instance = DagsterInstance.from_ref(
                InstanceRef.from_dir(str(self.storage.home)))
        return self._instance

    def close_instance(self) -> None:
        if self._instance is not None:
            with suppress(Exception):
                self._instance.dispose()
            self._instance = None


def _ready(dev: DagsterDev, locations: Sequence[str] = (LOCATION,)) -> bool:
    """Whether every one of `locations` is loaded (fails on a load error or an exit)."""
    if dev.process.poll() is not None:
        pytest.fail(f"dagster dev exited with {dev.process.returncode}\n{dev.log_tail()}")
    try:
        if httpx.get(f"{dev.url}/server_info", timeout=2.0).status_code != 200:
            return False
        data = dev.graphql("""{ workspaceOrError { __typename ... on Workspace {
            locationEntries { name loadStatus locationOrLoadError { __typename
              ... on PythonError { message } } } } } }""", timeout=10.0)
    except (httpx.HTTPError, ValueError):
        return False
    entries = data["workspaceOrError"].get("locationEntries") or []
    loaded = set()
    for entry in entries:
        if entry["name"] in locations and entry["loadStatus"] == "LOADED":
            error = entry["locationOrLoadError"]
            if error and error["__typename"] == "PythonError":
                pytest.fail(f"code location failed to load: {error['message']}\n"
                            f"{dev.log_tail()}")
            loaded.add(entry["name"])
    return loaded == set(locations)


def stop_process_group(process: subprocess.Popen, timeout: float = TERM_TIMEOUT) -> None:
    """SIGTERM the whole process group, then SIGKILL it after a bounded wait. Once
    `dagster dev` itself has exited, whoever is left in its group (a code server that its
    webserver or daemon started while shutting down, after the first SIGTERM) gets
    SIGTERM again."""
    try:
        pgid = os.getpgid(process.pid)
    except ProcessLookupError:
        pgid = process.pid
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.5)
        try:
            os.killpg(pgid, signal.SIGTERM if process.poll() is not None else 0)
        except ProcessLookupError:
            break  # nobody left in the group
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def storage(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Storage]:
    """Dagster storage and harvester database of one e2e session (SQLite or PostgreSQL);
    the test process uses the same harvester database."""
    made = make_storage(request.param, tmp_path)
    monkeypatch.setenv(db.DATABASE_URL_ENV, made.database_url)
    monkeypatch.setenv("DAGSTER_HOME", str(made.home))
    try:
        yield made
    finally:
        db.dispose_all()
        for cleanup in made.cleanups:
            cleanup()


def launch_dagster_dev(storage: Storage, workdir: Path, started: list[DagsterDev],
                       workspace: Path | None = None,
                       locations: Sequence[str] = (LOCATION,)) -> DagsterDev:
    """Start `dagster dev` on `storage` (harvesters registered beforehand are loaded), on
    `workspace` (the repository's workspace.yaml by default), appended to `started` at
    once (whoever owns the list stops it), and wait until every one of `locations` is
    loaded."""
    port = free_port()
    log_path = workdir / f"dagster-dev-{port}.log"
    log = log_path.open("wb")
    dev = DagsterDev(storage, port, None, log_path)  # type: ignore[arg-type]
    dev.process = subprocess.Popen(
        [str(DAGSTER), "dev", "-w", str(workspace or REPO_ROOT / "workspace.yaml"),
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=str(workdir), env=dev.env(), stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )
    log.close()
    started.append(dev)
    wait_for("dagster dev to serve the code location", lambda: _ready(dev, locations),
             STARTUP_TIMEOUT, on_timeout=dev.log_tail)
    return dev


def stop_all(started: list[DagsterDev]) -> None:
    """End every `dagster dev` in `started` (its process group), before the storage goes."""
    for dev in started:
        dev.close_instance()
        stop_process_group(dev.process)


@pytest.fixture
def start_dagster_dev(storage: Storage, tmp_path: Path) -> Iterator[Callable[..., DagsterDev]]:
    """Start `dagster dev` on the session's storage (harvesters registered beforehand are
    loaded), optionally on another workspace file; the finalizer always ends its process
    group, before the storage goes."""
    started: list[DagsterDev] = []

    def start(workspace: Path | None = None,
              locations: Sequence[str] = (LOCATION,)) -> DagsterDev:
        """Start it on `workspace` and wait until every one of `locations` is loaded."""
        return launch_dagster_dev(storage, tmp_path, started, workspace, locations)

    yield start
    stop_all(started)
