"""`harvester list` tells each schedule's state as the Dagster instance has it, the last
run and the since in force (a loopback server, a real in-process harvest)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import dagster as dg
import pytest

from oaipmh_dagster.contracts import HARVESTER_TAG, job_name
from oaipmh_dagster.defs._private import stop_schedule_states
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster_tests.conftest import Result
from oaipmh_dagster_tests.instigators import start_schedule
from oaipmh_dagster_tests.storage.test_registry import JSON_KEYS


@pytest.fixture(scope="module")
def server() -> Iterator[OAIServer]:
    srv = OAIServer(make_dataset(12, seed=5), page_size=5).start()
    yield srv
    srv.stop()


def add(run, hid: str, *extra: str, url: str = "http://127.0.0.1:9/oai") -> None:
    r = run("harvester", "add", hid, "--url", url, "--prefix", "oai_dc", "--no-check", *extra)
    assert r.code == 0, r.err


def table(r: Result) -> dict[str, dict[str, str]]:
    """id -> {column: cell} of the list's table (columns found by the header's offsets)."""
    assert r.code == 0, r.err
    header, rule, *rows = r.out.splitlines()
    spans, start = [], 0
    for dashes in rule.split("  "):
        if dashes.strip():
            begin = rule.index(dashes.strip(), start)
            spans.append((begin, begin + len(dashes.strip())))
            start = begin + len(dashes.strip())
    names = [header[a:b].strip() for a, b in spans]
    return {row[spans[0][0]:spans[0][1]].strip():
            {n: row[a:b].strip() for n, (a, b) in zip(names, spans, strict=True)}
            for row in rows}


def test_schedule_column_tells_the_real_state(run, database_url: str) -> None:
    add(run, "nocron")
    add(run, "nocron_on")
    add(run, "oncron", "--cron", "0 3 * * *")
    add(run, "disabled", "--cron", "0 3 * * *", "--disabled")
    add(run, "stopped", "--cron", "0 3 * * *")
    add(run, "started", "--cron", "0 3 * * *", "--disabled")
    with dg.DagsterInstance.get() as instance:
        start_schedule(instance, job_name("nocron_on"), "oaipmh_dagster", "0 0 1 1 *")
        start_schedule(instance, job_name("stopped"), "oaipmh_dagster", "0 3 * * *")
        assert stop_schedule_states(instance, job_name("stopped")) == 1  # as the UI does
        start_schedule(instance, job_name("started"), "oaipmh_dagster", "0 3 * * *")
    rows = table(run("harvester", "list"))
    assert {hid: row["schedule"] for hid, row in rows.items()} == {
        "nocron": "no cron", "nocron_on": "no cron", "oncron": "on", "disabled": "off",
        "stopped": "off", "started": "on"}
    assert all(row["last run"] == "-" for row in rows.values())
    assert all(row["since"] == "full next" for row in rows.values())
    items = {i["id"]: i for i in json.loads(run("harvester", "list", "--json").out)}
    assert items["stopped"]["state"] == {"schedule": "off", "last_run": None, "since": None}
    assert items["started"]["state"]["schedule"] == "on"
    assert all(set(i) == JSON_KEYS | {"state"} for i in items.values())


def test_last_run_and_since(run, database_url: str, server: OAIServer) -> None:
    add(run, "demo", "--cron", "0 3 * * *", url=server.base_url)
    add(run, "other")
    r = run("harvest", "demo")
    assert r.code == 0, r.err
    rows = table(run("harvester", "list"))
    assert rows["demo"]["last run"].startswith("SUCCESS 20")
    assert rows["demo"]["last run"].endswith("Z")
    assert rows["demo"]["since"][:2] == "20"
    assert rows["other"]["last run"] == "-"
    with dg.DagsterInstance.get() as instance:
        instance.add_run(dg.DagsterRun(job_name=job_name("demo"), run_id="f" * 36,
                                       status=dg.DagsterRunStatus.FAILURE,
                                       tags={HARVESTER_TAG: "demo"}))
    items = {i["id"]: i for i in json.loads(run("harvester", "list", "--json").out)}
    last = items["demo"]["state"]["last_run"]
    assert last["status"] == "FAILURE" and last["run_id"] == "f" * 36
    assert last["at"].endswith("Z")
    assert items["demo"]["state"]["since"] == rows["demo"]["since"]
    assert items["other"]["state"]["last_run"] is None
    rows = table(run("harvester", "list"))
    assert rows["demo"]["last run"].startswith("FAILURE ")


def test_a_run_that_failed_before_any_record_is_listed(run, database_url: str,
                                                        closed_port_url: str) -> None:
    """A run plans its assets when it is created: a harvest that never reached the
    endpoint still counts as the harvester's last run."""
    add(run, "down", "--max-retries", "0", "--timeout", "5", url=closed_port_url)
    assert run("harvest", "down").code == 1
    rows = table(run("harvester", "list"))
    assert rows["down"]["last run"].startswith("FAILURE ")
    assert rows["down"]["since"] == "full next"
