"""`oaipmh-dagster demo`: a busy port names the option (and make variable) that changes
it, before any harvest; "Dagster UI: http://..." is printed once the UI answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from oaipmh_dagster.cli import demo as demo_run
from oaipmh_dagster_tests.conftest import REPO_ROOT


@pytest.fixture
def demo_env(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return home


@pytest.fixture
def listener() -> Iterator[int]:
    """A port something listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _no_instance() -> dg.DagsterInstance:
    raise AssertionError("nothing may be harvested")


def test_busy_ui_port_names_the_option(demo_env: Path, listener: int,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code = demo_run.run_demo(ui_port=listener, oai_port=0, n_records=5, ui=True,
                             instance_factory=_no_instance)
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1
    assert f"port {listener}" in err and "--port" in err and "PORT=" in err


def test_busy_oai_port_names_the_option(demo_env: Path, listener: int,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = demo_run.run_demo(ui_port=_free_port(), oai_port=listener, n_records=5, ui=False,
                             instance_factory=_no_instance)
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1
    assert f"port {listener}" in err and "--oai-port" in err and "OAI_PORT=" in err


def test_port_in_use() -> None:
    free = _free_port()
    assert not demo_run.port_in_use(free)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free))
        sock.listen()
        assert demo_run.port_in_use(free)


# A stand-in UI: listens after argv[2] seconds, answers one request and ends (or ends
# after argv[3] seconds without one), so a slow machine cannot outlast its window.
SLOW_UI = """
import http.server, sys, time
time.sleep(float(sys.argv[2]))
answered = []
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
        answered.append(self.path)
    def log_message(self, *a): pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
server.timeout = 0.2
end = time.monotonic() + float(sys.argv[3])
while not answered and time.monotonic() < end:
    server.handle_request()
"""


def test_ui_line_waits_for_the_ui(tmp_path: Path) -> None:
    port = _free_port()
    script = tmp_path / "slow_ui.py"
    script.write_text(SLOW_UI)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(script), str(port), "1.5", "120"])
    try:
        assert demo_run.wait_for_ui(f"http://127.0.0.1:{port}", proc, poll=0.1)
        assert time.monotonic() - start >= 1.5
    finally:
        proc.kill()
        proc.wait()


def test_no_ui_line_when_the_ui_never_answers(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        assert not demo_run.wait_for_ui(f"http://127.0.0.1:{_free_port()}", proc, poll=0.1)
    finally:
        proc.wait()


def test_demo_prints_the_ui_line_after_it_answers(
        demo_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The whole command with a stand-in for `dagster dev` that answers after 1.5 s."""
    port = _free_port()
    script = tmp_path / "slow_ui.py"
    script.write_text(SLOW_UI)
    answered: list[float] = []
    echoed: list[tuple[float, str]] = []

    def fake_dev(ui_port: int, home: Path) -> subprocess.Popen:
        assert ui_port == port
        answered.append(time.monotonic() + 1.5)
        return subprocess.Popen([sys.executable, str(script), str(port), "1.5", "120"],
                                start_new_session=True)

    real_echo = demo_run.click.echo

    def echo(message: object = None, **kwargs: object) -> None:
        echoed.append((time.monotonic(), str(message)))
        real_echo(message, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(demo_run, "_dagster_dev", fake_dev)
    monkeypatch.setattr(demo_run.click, "echo", echo)
    with dg.instance_for_test() as instance:
        code = demo_run.run_demo(ui_port=port, oai_port=0, n_records=5, ui=True,
                                 instance_factory=lambda: instance)
    assert code == 0, capsys.readouterr()
    (line,) = [(t, m) for t, m in echoed if m.startswith("Dagster UI:")]
    assert any(m.startswith("oaipmh/demo/records_by_year: ") for _, m in echoed)
    assert line[1].startswith(f"Dagster UI: http://127.0.0.1:{port}")
    assert line[0] >= answered[0]


def test_dagster_dev_tells_its_runs_the_ui_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo PORT=3111`: manage_harvesters in its runs reloads that webserver, not
    the default :3000 (nor one named by a variable left in the shell)."""
    from oaipmh_dagster.operations.reload import WEBSERVER_ENV

    monkeypatch.setenv(WEBSERVER_ENV, "http://127.0.0.1:3000")
    env = demo_run.dagster_dev_env(3111)
    assert env[WEBSERVER_ENV] == "http://127.0.0.1:3111"
    assert env["DAGSTER_HOME"] == os.environ["DAGSTER_HOME"]


def test_dagster_dev_runs_in_the_dagster_home(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    cmd, cwd = demo_run.dagster_dev_command(3999, tmp_path)
    assert cwd == tmp_path
    assert cmd[cmd.index("-w") + 1] == str(tmp_path / demo_run.DEMO_WORKSPACE)


def test_dagster_dev_does_not_warn_about_the_root_dagster_yaml(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Started as the demo starts it (from the repository root, whose dagster.yaml the demo
    copied into $DAGSTER_HOME), `dagster dev` uses the copy and prints no warning that the
    root's file is ignored."""
    monkeypatch.chdir(REPO_ROOT)
    home = tmp_path / "home"
    home.mkdir()
    demo_run.ensure_instance_yaml(home)
    assert (home / "dagster.yaml").read_text() == (REPO_ROOT / "dagster.yaml").read_text()
    cmd, cwd = demo_run.dagster_dev_command(_free_port(), home)
    env = {**os.environ, "DAGSTER_HOME": str(home),
           "OAIPMH_DATABASE_URL": f"sqlite:///{tmp_path / 'reg.sqlite'}"}
    log = tmp_path / "dev.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "Launching Dagster services" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
    finally:
        demo_run.stop_group(proc)
    assert "will not be used to configure Dagster" not in log.read_text()


def test_built_in_instance_yaml_is_the_shipped_one() -> None:
    """Outside a checkout (no dagster.yaml in the working directory) the demo writes its
    built-in copy: the same settings, concurrency the current way (`concurrency:`)."""
    import yaml

    assert yaml.safe_load(demo_run.INSTANCE_YAML) == yaml.safe_load(
        (REPO_ROOT / "dagster.yaml").read_text())


def test_busy_hub_port_names_the_option(demo_env: Path, listener: int,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = demo_run.run_demo(ui_port=_free_port(), oai_port=0, n_records=5, ui=True,
                             instance_factory=_no_instance, hub_port=listener)
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1
    assert f"port {listener}" in err and "--hub-port" in err and "HUB_PORT=" in err


def test_the_demo_hub_serves_what_the_demo_harvested(demo_env: Path) -> None:
    """The hub the demo starts serves its store; a second harvester harvesting the hub's
    `demo` set (as the README shows) gets every live record of the demo harvester."""
    from oaipmh_dagster.harvesting.harvest import harvest
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import Harvester, Registry
    from oaipmh_dagster.storage.store import Store

    with dg.instance_for_test() as instance:
        assert demo_run.run_demo(ui_port=_free_port(), oai_port=0, n_records=12, ui=False,
                                 instance_factory=lambda: instance) == 0
    port = _free_port()
    hub = demo_run.start_hub(port)
    try:
        url = f"http://127.0.0.1:{port}/oai"
        assert demo_run.wait_for_hub(url, hub, timeout=120)
        h = Registry(db.get_engine()).add(Harvester(
            id="from_hub", base_url=url, metadata_prefix="oai_dc", sets=("demo",)))
        stats = harvest(h, Store(), run_id="hub")
    finally:
        demo_run.stop_group(hub)
    store = Store()
    demo = [i for i in store.iter_records("demo") if not i["deleted"]]
    got = [i for i in store.iter_records("from_hub") if not i["deleted"]]
    assert demo and stats.records >= len(demo)
    assert sorted(i["oai_identifier"].rsplit(":demo:", 1)[1] for i in got) == sorted(
        i["oai_identifier"] for i in demo)
