"""`oaipmh-dagster serve`: bad input is one line and nothing listens; good input serves."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from lxml import etree

from oaipmh_dagster_tests.conftest import REPO_ROOT, Result
from oaipmh_dagster_tests.serve.conftest import OAI


def test_a_bad_host_is_one_line(run: Callable[..., Result], sqlite_url: str) -> None:
    result = run("serve", "--host", "no-such-host.invalid", "--port", "0")
    assert result.code == 2
    assert "--host 'no-such-host.invalid'" in result.error_line


def test_a_taken_port_is_one_line(run: Callable[..., Result], sqlite_url: str) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        result = run("serve", "--port", str(port))
    finally:
        taken.close()
    assert result.code == 1
    assert result.error_line.endswith(f"cannot listen on 127.0.0.1:{port}: the port is taken")


def test_an_unreachable_database_is_one_line(run: Callable[..., Result], closed_port_url: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    port = closed_port_url.split(":")[2].split("/")[0]
    monkeypatch.setenv("OAIPMH_DATABASE_URL", f"postgresql+psycopg2://u@127.0.0.1:{port}/x")
    result = run("serve", "--port", "0")
    assert result.code == 1
    assert "cannot reach database" in result.error_line


def test_a_bad_setting_is_one_line(run: Callable[..., Result], sqlite_url: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OAIPMH_SERVE_HUB_NAME", "a:b")
    result = run("serve", "--port", "0")
    assert result.code == 2
    assert "OAIPMH_SERVE_HUB_NAME" in result.error_line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_command_serves_until_terminated(tmp_path: Path) -> None:
    """A real process: it answers Identify, then ends on SIGTERM."""
    port = _free_port()
    env = {**os.environ, "OAIPMH_DATABASE_URL": f"sqlite:///{tmp_path / 'hub.sqlite'}",
           "OAIPMH_SERVE_ADMIN_EMAIL": "ops@example.org", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "oaipmh_dagster.cli", "serve", "--port",
                             str(port), "--no-access-log"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        body = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/oai?verb=Identify", timeout=5).content
                break
            except httpx.TransportError:
                time.sleep(0.2)
        root = etree.fromstring(body)
        assert root.findtext(f"{OAI}Identify/{OAI}adminEmail") == "ops@example.org"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert f"over OAI-PMH at http://127.0.0.1:{port}/oai" in err.decode()
    assert "Traceback" not in err.decode()
