"""Fixtures of the browser tests: a real `oaipmh-dagster demo` (demo endpoint, demo
harvesters, one harvest each, `dagster dev`) on free loopback ports, and Debian's headless
Chromium driven by Playwright.

Chromium is always `/usr/bin/chromium` from Debian's packages (`scripts/install-chromium.sh`);
Playwright never downloads a browser of its own. Without it the tests skip, or fail when
`OAIPMH_REQUIRE_BROWSER=1` (CI).

Every step saves a screenshot under `test-artifacts/browser/`; a failing test also saves the
page's HTML and a screenshot of the moment it failed. With `OAIPMH_UPDATE_SCREENSHOTS=1` the
step screenshots are copied to `docs/screenshots/` as well (the committed UI tour)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts" / "browser"
DOCS_SCREENSHOTS = REPO_ROOT / "docs" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-quic",
    "--no-first-run",
    "--disable-sync",
]
REQUIRE_BROWSER = os.environ.get("OAIPMH_REQUIRE_BROWSER") == "1"
UPDATE_SCREENSHOTS = os.environ.get("OAIPMH_UPDATE_SCREENSHOTS") == "1"
LOCATION = "oaipmh_dagster"
STARTUP_TIMEOUT = 180.0
VIEWPORT = {"width": 1400, "height": 1000}

_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


def browser_unavailable() -> str | None:
    """None when Debian's Chromium and the Playwright package are there, else why not."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return (f"{CHROMIUM} not found: install Debian's chromium package "
                "(scripts/install-chromium.sh)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is not installed (pip install -e '.[dev]')"
    return None


def require_browser() -> None:
    """Skip without a browser, or fail when OAIPMH_REQUIRE_BROWSER=1."""
    reason = browser_unavailable()
    if reason:
        if REQUIRE_BROWSER:
            pytest.fail(f"{reason} (OAIPMH_REQUIRE_BROWSER=1 makes it mandatory)")
        pytest.skip(reason)


# --------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    state: str
    start: int  # clock ticks since boot: tells a reused pid apart


def _processes() -> dict[int, _Proc]:
    """Every process of this machine, from /proc."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        out[int(entry.name)] = _Proc(int(entry.name), int(fields[1]), fields[0], int(fields[19]))
    return out


def _descendants(root: int) -> set[tuple[int, int]]:
    """(pid, start) of `root` and everything below it."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            found.add((pid, procs[pid].start))
            todo.extend(children.get(pid, []))
    return found


def _alive(tree: set[tuple[int, int]]) -> list[int]:
    """Members of `tree` still running (zombies count as gone)."""
    procs = _processes()
    return sorted(pid for pid, start in tree
                  if pid in procs and procs[pid].start == start and procs[pid].state != "Z")


def _wait_gone(tree: set[tuple[int, int]], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _alive(tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


# --------------------------------------------------------------------------- the UI


class GraphQLError(AssertionError):
    """The webserver answered a GraphQL request with errors."""


@dataclass
class DagsterUI:
    """A running `oaipmh-dagster demo`: its UI address, GraphQL, and where it keeps state."""

    base_url: str
    oai_url: str
    home: Path
    log_path: Path
    process: subprocess.Popen

    def graphql(self, query: str, variables: dict[str, Any] | None = None,
                timeout: float = 30.0) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(
            f"{self.base_url}/graphql", data=body,
            headers={"Content-Type": "application/json"}, method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - loopback
            answer = json.loads(resp.read())
        if answer.get("errors"):
            raise GraphQLError(json.dumps(answer["errors"])[:2000])
        return answer["data"]

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


WORKSPACE_QUERY = """
{ workspaceOrError { __typename ... on Workspace { locationEntries {
    name loadStatus locationOrLoadError { __typename ... on PythonError { message } }
} } } }
"""


def _location_loaded(ui: DagsterUI) -> bool:
    """Whether the webserver answers and has loaded the code location without error."""
    try:
        with urllib.request.urlopen(f"{ui.base_url}/server_info", timeout=3):  # noqa: S310
            pass
        data = ui.graphql(WORKSPACE_QUERY, timeout=10)
    except (OSError, urllib.error.URLError, GraphQLError, ValueError):
        return False
    for entry in data["workspaceOrError"].get("locationEntries") or []:
        if entry["name"] != LOCATION or entry["loadStatus"] != "LOADED":
            continue
        result = entry["locationOrLoadError"] or {}
        if result.get("__typename") == "PythonError":
            pytest.fail(f"code location {LOCATION} failed to load: {result.get('message')}")
        return result.get("__typename") == "RepositoryLocation"
    return False


def _default_signals() -> None:
    """In the child: Ctrl-C and SIGTERM act again even when this pytest was started in the
    background of a non-interactive shell (which ignores SIGINT, and the ignoring would be
    inherited by the demo and `dagster dev`, leaving them deaf to the teardown)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def _stop(ui: DagsterUI) -> None:
    """Ctrl-C the demo (it ends `dagster dev`'s own process group), then make sure that
    nothing it started is left: SIGTERM, then SIGKILL stragglers, all bounded."""
    proc = ui.process
    tree = _descendants(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(45)  # the demo gives `dagster dev` 20 s, then kills its group
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        left = _alive(tree)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        _wait_gone(tree, grace)
    if proc.poll() is None:
        proc.kill()
    proc.wait(5)
    left = _alive(tree)
    assert not left, "processes left after stopping the demo: " + "; ".join(
        f"{pid} {_cmdline(pid)}" for pid in left)


@pytest.fixture(scope="session")
def dagster_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterUI]:
    """`oaipmh-dagster demo` on free ports with a temporary DAGSTER_HOME and SQLite
    database, started from the repository root (workspace.yaml, dagster.yaml)."""
    require_browser()
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    base = tmp_path_factory.mktemp("dagster-ui")
    home = base / "dagster_home"
    home.mkdir()
    ui_port, oai_port = _free_port(), _free_port()
    while oai_port == ui_port:
        oai_port = _free_port()
    base_url = f"http://127.0.0.1:{ui_port}"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "OAIPMH_DATABASE_URL": f"sqlite:///{base / 'oaipmh.sqlite'}",
        "OAIPMH_DAGSTER_WEBSERVER": base_url,
        "OAIPMH_SINCE_SENSOR_INTERVAL": "5",  # the cursor step waits for a tick
        "PYTHONUNBUFFERED": "1",
    }
    log_path = ARTIFACTS / "oaipmh-dagster-demo.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "oaipmh_dagster.cli", "demo", "--port", str(ui_port),
             "--oai-port", str(oai_port)],
            cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_default_signals,
        )
    ui = DagsterUI(base_url, f"http://127.0.0.1:{oai_port}/oai", home, log_path, process)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not _location_loaded(ui):
            if process.poll() is not None:
                pytest.fail(f"oaipmh-dagster demo exited with {process.returncode}:\n"
                            f"{ui.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the Dagster UI did not load {LOCATION} within "
                            f"{STARTUP_TIMEOUT:.0f} s:\n{ui.log_tail()}")
            time.sleep(1.0)
        # Dagster greets a first visit on 127.0.0.1 with a newsletter dialog: mark it seen.
        ui.graphql("mutation { setNuxSeen }")
        yield ui
    finally:
        _stop(ui)


# --------------------------------------------------------------------------- the browser


@pytest.fixture(scope="session")
def browser(dagster_ui: DagsterUI) -> Iterator[Any]:
    """Debian's headless Chromium (never a browser that Playwright downloads)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True,
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Keep each phase's report on the item, so fixtures can tell a failed test."""
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def _slug(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.split("::", 1)[-1]).strip("_")


@pytest.fixture
def page(browser: Any, dagster_ui: DagsterUI, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh browser context and page on the UI; on failure its HTML and a screenshot
    land in test-artifacts/browser/."""
    from playwright.sync_api import expect

    expect.set_options(timeout=30_000)
    context = browser.new_context(base_url=dagster_ui.base_url, viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    context.set_default_navigation_timeout(60_000)
    pg = context.new_page()
    try:
        yield pg
    finally:
        report = request.node.stash.get(_REPORTS, {}).get("call")
        if report is not None and report.failed:
            stem = ARTIFACTS / f"FAILED-{_slug(request.node.nodeid)}"
            with contextlib.suppress(Exception):
                stem.with_suffix(".html").write_text(pg.content())
            with contextlib.suppress(Exception):
                pg.screenshot(path=str(stem.with_suffix(".png")))
            with contextlib.suppress(Exception):
                stem.with_suffix(".log").write_text(dagster_ui.log_tail(200))
        context.close()


@pytest.fixture
def shot() -> Callable[..., Path]:
    """`shot(page, "01-job")`: save test-artifacts/browser/01-job.png (and copy it to
    docs/screenshots/, which docs/ui-tour.md shows, when OAIPMH_UPDATE_SCREENSHOTS=1 and
    `docs` is true)."""

    def save(pg: Any, name: str, *, docs: bool = True) -> Path:
        path = ARTIFACTS / f"{name}.png"
        pg.screenshot(path=str(path), animations="disabled")
        if UPDATE_SCREENSHOTS and docs:
            DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, DOCS_SCREENSHOTS / path.name)
        return path

    return save
