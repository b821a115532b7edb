"""The run-failure alert: off without OAIPMH_ALERT_WEBHOOK; with it, a failed harvest is
posted to a loopback webhook as JSON with the harvester, the error and a link to the run."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import dagster as dg
import pytest

from oaipmh_dagster.contracts import op_name
from oaipmh_dagster.dagster_parts import alerts
from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.registry import Harvester
from oaipmh_dagster_tests.helpers import add_harvester


class Receiver:
    """A loopback webhook: records each POSTed JSON body, answers with `status`."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers["Content-Length"])
                receiver.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/s3cr3t-token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with Receiver() as r:
        monkeypatch.setenv(alerts.WEBHOOK_ENV, r.url)
        yield r


def _sensor_names(harvesters: list[Harvester]) -> set[str]:
    repo = build_definitions(harvesters).get_repository_def()
    return {s.name for s in repo.sensor_defs}


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(alerts.WEBHOOK_ENV, raising=False)
    assert alerts.build_alert_sensor() is None
    assert alerts.ALERT_SENSOR_NAME not in _sensor_names([])


def test_on_with_a_webhook(receiver: Receiver) -> None:
    h = Harvester(id="alpha", base_url="http://127.0.0.1:9/oai", metadata_prefix="oai_dc")
    assert alerts.ALERT_SENSOR_NAME in _sensor_names([h])
    sensor = alerts.build_alert_sensor()
    assert sensor is not None and sensor.default_status == dg.DefaultSensorStatus.RUNNING


def _failed_run(h: Harvester, instance: dg.DagsterInstance) -> dg.RunFailureSensorContext:
    job = build_definitions([h]).resolve_job_def(h.job_name)
    result = job.execute_in_process(run_config={"ops": {op_name(h.id): {"config": {}}}},
                                    instance=instance, raise_on_error=False)
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    assert run is not None
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE)
    return dg.build_run_status_sensor_context(
        sensor_name=alerts.ALERT_SENSOR_NAME, dagster_event=failure,
        dagster_instance=instance, dagster_run=run).for_run_failure()


def test_failed_harvest_is_posted(receiver: Receiver, sqlite_url: str, closed_port_url: str,
                                  instance: dg.DagsterInstance,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(alerts.UI_URL_ENV, "https://dagster.example.org/")
    h = add_harvester("broken", closed_port_url, max_retries=0, timeout=2.0)
    context = _failed_run(h, instance)
    sensor = alerts.build_alert_sensor()
    assert sensor is not None
    sensor(context)
    assert len(receiver.bodies) == 1
    body = receiver.bodies[0]
    assert set(body) == {"harvester", "job", "run_id", "error", "url"}
    assert body["harvester"] == "broken"
    assert body["job"] == "harvest_oaipmh_records_broken"
    assert body["run_id"] == context.dagster_run.run_id
    assert body["url"] == f"https://dagster.example.org/runs/{body['run_id']}"
    assert f"{op_name('broken')}:" in body["error"]
    assert closed_port_url.split("//")[1].split("/")[0] in body["error"]


def test_webhook_refusal_fails_the_tick_without_its_secret(
        receiver: Receiver, sqlite_url: str, closed_port_url: str,
        instance: dg.DagsterInstance) -> None:
    receiver.status = 500
    h = add_harvester("broken", closed_port_url, max_retries=0, timeout=2.0)
    context = _failed_run(h, instance)
    sensor = alerts.build_alert_sensor()
    assert sensor is not None
    with pytest.raises(dg.Failure) as caught:
        sensor(context)
    assert "s3cr3t" not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)


def test_asset_graph_runs_name_their_harvester(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of the asset graph's job carry no harvester tag: the assets name it."""
    monkeypatch.delenv(alerts.UI_URL_ENV, raising=False)
    monkeypatch.setenv("OAIPMH_DAGSTER_WEBSERVER", "http://10.0.0.5:3000")
    run = dg.DagsterRun(job_name="__ASSET_JOB", run_id="abc",
                        asset_selection=frozenset({dg.AssetKey(["oaipmh", "beta", "raw_records"]),
                                                   dg.AssetKey(["oaipmh", "beta", "records"])}))
    payload = alerts.alert_payload(run, "x" * 5000)
    assert payload["harvester"] == "beta"
    assert payload["url"] == "http://10.0.0.5:3000/runs/abc"
    assert len(payload["error"]) == alerts.MAX_ERROR
