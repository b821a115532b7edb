"""`harvester remove` stops the harvester's schedule through Dagster's public ways: the
webserver's GraphQL `stopRunningSchedule` when one answers, else in the instance."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import dagster as dg
import pytest

from oaipmh_dagster.cli import commands as cli
from oaipmh_dagster.operations import reload
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.instigators import start_schedule


class _FakeWebserver(BaseHTTPRequestHandler):
    """Answers the GraphQL documents `stop_schedule` sends, and records them."""

    calls: list[dict[str, Any]] = []
    status = "RUNNING"
    locations: list[str] = ["oaipmh_dagster"]

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append(body)
        if "workspaceOrError" in body["query"]:
            data = {"workspaceOrError": {"__typename": "Workspace", "locationEntries": [
                {"name": name} for name in type(self).locations]}}
        elif "stopRunningSchedule" in body["query"]:
            data = {"stopRunningSchedule": {"__typename": "ScheduleStateResult",
                                            "scheduleState": {"status": "STOPPED"}}}
        else:
            data = {"scheduleOrError": {"__typename": "Schedule", "id": "sched-id",
                                        "scheduleState": {"status": type(self).status}}}
        payload = json.dumps({"data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webserver() -> Iterator[str]:
    _FakeWebserver.calls = []
    _FakeWebserver.status = "RUNNING"
    _FakeWebserver.locations = ["oaipmh_dagster"]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeWebserver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_graphql_stops_a_running_schedule(webserver: str) -> None:
    done, message = reload.stop_schedule("harvest_oaipmh_records_a", url=webserver,
                                         location="loc")
    assert (done, message) == (True, "stopped schedule harvest_oaipmh_records_a")
    query, mutation = _FakeWebserver.calls
    assert query["variables"]["selector"] == {
        "repositoryLocationName": "loc", "repositoryName": "__repository__",
        "scheduleName": "harvest_oaipmh_records_a"}
    assert mutation["variables"] == {"id": "sched-id"}


def test_graphql_leaves_a_stopped_schedule_alone(webserver: str) -> None:
    _FakeWebserver.status = "STOPPED"
    done, _ = reload.stop_schedule("harvest_oaipmh_records_a", url=webserver, location="loc")
    assert done is True and len(_FakeWebserver.calls) == 1


def test_the_schedule_is_stopped_in_the_shard_that_holds_the_harvester(webserver: str) -> None:
    from oaipmh_dagster.operations.shards import Shard

    names = [Shard(i, 4).location_name() for i in range(4)]
    _FakeWebserver.locations = names
    done, _ = reload.stop_schedule("harvest_oaipmh_records_a", url=webserver,
                                   harvester_id="a")
    assert done is True
    lookup, query, _ = _FakeWebserver.calls
    assert "workspaceOrError" in lookup["query"]
    holder = next(n for n in names if Shard.of_location(n, 4).holds("a"))  # type: ignore[union-attr]
    assert query["variables"]["selector"]["repositoryLocationName"] == holder


def test_no_webserver_is_reported_not_raised() -> None:
    done, message = reload.stop_schedule("x", url="http://127.0.0.1:9", timeout=2)
    assert done is None and "no Dagster webserver" in message


def _schedule_status(name: str) -> str | None:
    with dg.DagsterInstance.get() as instance:
        for state in instance.all_instigator_state():
            if state.name == name:
                return state.status.value
    return None


def test_remove_without_webserver_stops_a_started_schedule(
    sqlite_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    h = add_harvester("sched", "http://127.0.0.1:9/oai", cron="0 3 * * *", enabled=False)
    with dg.DagsterInstance.get() as instance:
        start_schedule(instance, h.job_name, "oaipmh_dagster", h.cron or "")
    assert _schedule_status(h.job_name) == "RUNNING"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["harvester", "remove", "sched", "--yes"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert f"stopped schedule {h.job_name}" in out and "removed harvester sched" in out
    assert _schedule_status(h.job_name) == "STOPPED"
