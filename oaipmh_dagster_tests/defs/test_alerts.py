"""The run-failure alert: off without OAIPMH_ALERT_WEBHOOK; with it, each failed harvest is
posted once to a loopback webhook as JSON with the harvester, the error and a link to the
run, within a total deadline whatever the receiver does, and the webhook's secrets (user
info, path, query) appear in no log, tick message or cursor."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import dagster as dg
import pytest

from oaipmh_dagster.contracts import CHECK_NO_FAILED, op_name
from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs import alerts, webhook
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster_tests.helpers import add_harvester

SECRETS = ("hunter2", "s3cr3t-path", "t0k3n-query")
DEADLINE = 1.0  # seconds, OAIPMH_ALERT_TIMEOUT in these tests
# Each wait of the tests is bounded, generously for a loaded machine: a tick posts for
# at most twice the deadline (its budget; a tick that stops posting says "more alerts
# wait for the next tick"), a receiver that ignored the deadline would hold it for
# minutes (a trickle of 340 s, a silence of 600 s).
TICK_BOUND = 2 * DEADLINE + 20.0
MAX_TICKS = 10


class Receiver:
    """A loopback webhook. `mode`: "ok" (answers `status`), "trickle" (one byte of a
    status line every 0.2 s until stopped), "silent" (reads the request, never answers).
    Every request is recorded (path, Authorization header, JSON body)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 200
        self.mode = "ok"
        self.stop = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers["Content-Length"])
                receiver.requests.append({"path": self.path,
                                          "auth": self.headers.get("Authorization"),
                                          "body": json.loads(self.rfile.read(length))})
                if receiver.mode == "trickle":
                    for byte in b"HTTP/1.1 200 OK\r\n" * 100:
                        if receiver.stop.wait(0.2):
                            return
                        try:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                        except OSError:  # the client gave up: its deadline
                            return
                    return
                if receiver.mode == "silent":
                    receiver.stop.wait(600)
                    return
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        port = self.server.server_address[1]
        self.url = (f"http://hook:{SECRETS[0]}@127.0.0.1:{port}/hooks/{SECRETS[1]}"
                    f"?token={SECRETS[2]}")
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def run_ids(self) -> list[str]:
        return [r["body"]["run_id"] for r in self.requests]

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with Receiver() as r:
        monkeypatch.setenv(alerts.WEBHOOK_ENV, r.url)
        monkeypatch.setenv(alerts.TIMEOUT_ENV, str(DEADLINE))
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


def _fail(h: Harvester, instance: dg.DagsterInstance) -> str:
    """A failed run of `h`'s job on `instance`: its id."""
    job = build_definitions([h]).resolve_job_def(h.job_name)
    result = job.execute_in_process(run_config={"ops": {op_name(h.id): {"config": {}}}},
                                    instance=instance, raise_on_error=False)
    assert not result.success
    return result.run_id


class Ticks:
    """Evaluates the alert sensor tick after tick as the daemon does (the cursor a tick
    returns is the next tick's), each in a thread whose end is awaited with a bound."""

    def __init__(self, instance: dg.DagsterInstance,
                 harvesters: tuple[Harvester, ...] = (), repository_def: Any = None) -> None:
        self.instance = instance
        self.harvesters = harvesters
        self.repository_def = repository_def
        self.cursor: str | None = None
        self.messages: list[str] = []

    def tick(self) -> dg.SensorResult | Any:
        sensor = alerts.build_alert_sensor(self.harvesters)
        assert sensor is not None
        out: list[Any] = []
        context = dg.build_sensor_context(instance=self.instance, cursor=self.cursor,
                                          repository_def=self.repository_def)
        worker = threading.Thread(target=lambda: out.append(sensor.evaluate_tick(context)),
                                  daemon=True)
        worker.start()
        worker.join(TICK_BOUND)
        assert not worker.is_alive(), f"a tick took more than {TICK_BOUND} s"
        data = out[0]
        self.cursor = data.cursor
        self.messages.append(str(data.skip_message))
        return data

    def until_quiet(self) -> int:
        """Ticks until a tick has nothing left to send (bounded): how many ran."""
        for n in range(1, MAX_TICKS + 1):
            if "no newly failed runs" in str(self.tick().skip_message):
                return n
        raise AssertionError(f"alerts still pending after {MAX_TICKS} ticks")


def _logged(caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> str:
    """Everything logged: Python loggers, and the sensor's own log (Dagster writes it to
    the process's stderr and to the tick's captured log)."""
    out, err = capfd.readouterr()
    return "\n".join([caplog.text, out, err])


def _no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


def test_failed_harvest_is_posted_once(receiver: Receiver, sqlite_url: str,
                                       closed_port_url: str, instance: dg.DagsterInstance,
                                       monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture,
                                       capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(alerts.UI_URL_ENV, "https://dagster.example.org/")
    h = add_harvester("broken", closed_port_url, max_retries=0, timeout=2.0)
    _fail(h, instance)  # history: the first tick starts after it
    ticks = Ticks(instance)
    ticks.tick()
    run_id = _fail(h, instance)
    ticks.until_quiet()
    ticks.until_quiet()
    assert receiver.run_ids == [run_id]
    request = receiver.requests[0]
    assert request["path"] == f"/hooks/{SECRETS[1]}?token={SECRETS[2]}"
    assert request["auth"] is not None and request["auth"].startswith("Basic ")
    body = request["body"]
    assert set(body) == {"kind", "harvester", "job", "run_id", "error", "url"}
    assert body["kind"] == "run_failure"
    assert body["harvester"] == "broken"
    assert body["job"] == "harvest_oaipmh_records_broken"
    assert body["url"] == f"https://dagster.example.org/runs/{run_id}"
    assert f"{op_name('broken')}:" in body["error"]
    assert closed_port_url.split("//")[1].split("/")[0] in body["error"]
    logged = _logged(caplog, capfd)
    assert f"alert for run {run_id} sent to http://127.0.0.1:" in logged
    _no_secret(logged, str(ticks.cursor), *ticks.messages)


@pytest.mark.parametrize("mode", ["trickle", "silent", "500"])
def test_a_failing_webhook_bounds_each_tick_and_alerts_once(
        mode: str, receiver: Receiver, sqlite_url: str, closed_port_url: str,
        instance: dg.DagsterInstance, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    """A receiver that trickles, never answers or refuses: every tick ends within its
    bound, each failed run is tried exactly once across ticks, and the failure is
    logged without the webhook's secrets."""
    caplog.set_level(logging.DEBUG)
    if mode == "500":
        receiver.status = 500
    else:
        receiver.mode = mode
    h = add_harvester("broken", closed_port_url, max_retries=0, timeout=2.0)
    ticks = Ticks(instance)
    ticks.tick()
    run_ids = [_fail(h, instance) for _ in range(3)]
    ticks.until_quiet()
    ticks.until_quiet()
    assert sorted(receiver.run_ids) == sorted(run_ids)
    logged = _logged(caplog, capfd)
    for run_id in run_ids:
        assert f"alert for run {run_id} NOT delivered to http://127.0.0.1:" in logged
        assert any(run_id in message for message in ticks.messages)
    if mode != "500":
        assert f"no complete answer within {DEADLINE:g} s" in logged
        assert any("wait for the next tick" in message for message in ticks.messages)
    _no_secret(logged, str(ticks.cursor), *ticks.messages)


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


@pytest.mark.parametrize("mode", ["trickle", "silent"])
def test_a_post_ends_at_its_deadline(mode: str, receiver: Receiver) -> None:
    """The deadline is total: a receiver that keeps the connection busy is cut off and the
    worker thread ends (its socket is shut), the receiver still sending."""
    receiver.mode = mode
    done: list[webhook.Delivery] = []
    caller = threading.Thread(target=lambda: done.append(
        webhook.post_json(receiver.url, {"x": 1}, DEADLINE)), daemon=True)
    caller.start()
    caller.join(TICK_BOUND)
    assert not caller.is_alive() and not receiver.stop.is_set()
    assert done == [webhook.Delivery(False, f"no complete answer within {DEADLINE:g} s")]
    assert not any(t.name == "oaipmh-alert-post" for t in threading.enumerate())


def test_messages_name_the_webhook_by_its_origin_only() -> None:
    assert webhook.origin("https://u:p@hooks.example.org:8443/T0/B1/xyz?token=t#f") == \
        "https://hooks.example.org:8443"
    assert webhook.origin("https://hooks.example.org/services/abc") == "https://hooks.example.org"
    assert "abc" not in webhook.origin("http://[::1/abc")


def test_cursor_of_dagsters_run_failure_sensor_is_adopted() -> None:
    """The sensor was a run-failure sensor: its stored cursor carries on, no replay."""
    legacy = ('{"__class__": "RunStatusSensorCursor", "record_id": 7, '
              '"record_timestamp": "2026-01-01T00:00:00+00:00", "update_timestamp": null}')
    assert alerts.parse_cursor(legacy) == 7
    assert alerts.parse_cursor('{"after": 12}') == 12
    for bad in (None, "", "{", "[]", '{"after": "x"}', '{"after": true}'):
        assert alerts.parse_cursor(bad) is None


def test_only_this_locations_runs_are_alerted() -> None:
    """A run launched from another code location is that location's sensor's; a run
    launched from none (the CLI's) is alerted where its harvester lives."""
    cli_run = dg.DagsterRun(job_name="harvest_oaipmh_records_beta", run_id="r1",
                            tags={"oaipmh/harvester": "beta"})
    here = frozenset({"beta"})
    assert alerts._ours(cli_run, "loc_a", here)
    assert not alerts._ours(cli_run, "loc_b", frozenset({"gamma"}))
    assert alerts._ours(cli_run, None, frozenset())


def _freshness(instance: dg.DagsterInstance, hid: str, state: str) -> None:
    """Record a freshness state change of `hid`'s raw_records as Dagster's freshness
    daemon does."""
    from dagster._core.definitions.freshness import FreshnessState, FreshnessStateChange

    instance._report_runless_asset_event(asset_event=FreshnessStateChange(  # noqa: SLF001
        key=asset_keys(hid)[1], previous_state=FreshnessState.UNKNOWN,
        new_state=FreshnessState(state), state_change_timestamp=time.time()))


def _check(instance: dg.DagsterInstance, hid: str, passed: bool) -> None:
    """Record an evaluation of `hid`'s no_failed_records check."""
    instance.report_runless_asset_event(dg.AssetCheckEvaluation(
        asset_key=asset_keys(hid)[2], check_name=CHECK_NO_FAILED, passed=passed,
        severity=dg.AssetCheckSeverity.WARN, metadata={"failed_in_store": 0 if passed else 3}))


def test_freshness_fail_and_failed_checks_are_posted_once_per_transition(
        receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
        instance: dg.DagsterInstance) -> None:
    """A harvester that turns bad is posted once, however many ticks (or failed check
    evaluations) it stays bad; again only after it recovered and failed anew. What was
    bad before the sensor started is not posted."""
    monkeypatch.setenv(alerts.UI_URL_ENV, "https://dagster.example.org")
    alpha, beta = (Harvester(id=i, base_url="http://127.0.0.1:9/oai", metadata_prefix="oai_dc")
                   for i in ("alpha", "beta"))
    _freshness(instance, "beta", "FAIL")  # before the first tick
    ticks = Ticks(instance, (alpha, beta))
    ticks.tick()
    _freshness(instance, "alpha", "FAIL")
    _check(instance, "alpha", passed=False)
    ticks.until_quiet()
    _check(instance, "alpha", passed=False)  # stays failed: no second message
    ticks.until_quiet()
    kinds = sorted(r["body"]["kind"] for r in receiver.requests)
    assert kinds == ["check_failed", "freshness_fail"]
    check = next(r["body"] for r in receiver.requests if r["body"]["kind"] == "check_failed")
    assert check == {"kind": "check_failed", "harvester": "alpha",
                     "asset": "oaipmh/alpha/records", "check": CHECK_NO_FAILED,
                     "error": "failed (warn); failed_in_store: 3",
                     "url": "https://dagster.example.org/assets/oaipmh/alpha/records"
                            "?view=checks"}
    fresh = next(r["body"] for r in receiver.requests if r["body"]["kind"] == "freshness_fail")
    assert fresh["harvester"] == "alpha" and fresh["asset"] == "oaipmh/alpha/raw_records"
    assert fresh["error"].startswith("freshness FAIL since ")
    _check(instance, "alpha", passed=True)
    _freshness(instance, "alpha", "PASS")
    ticks.until_quiet()
    assert len(receiver.requests) == 2
    _check(instance, "alpha", passed=False)
    _freshness(instance, "alpha", "FAIL")
    ticks.until_quiet()
    ticks.until_quiet()
    again = [r["body"]["kind"] for r in receiver.requests[2:]]
    assert sorted(again) == ["check_failed", "freshness_fail"]
    assert all(r["body"]["harvester"] == "alpha" for r in receiver.requests)


def _check_in_run(instance: dg.DagsterInstance, hid: str, run_id: str,
                  passed: bool | None) -> None:
    """Record, as a run does, the plan of `hid`'s no_failed_records check (`passed` None)
    or its evaluation."""
    from dagster._core.definitions.asset_checks.asset_check_evaluation import (
        AssetCheckEvaluationPlanned,
    )
    from dagster._core.events import DagsterEvent, DagsterEventType
    from dagster._core.events.log import EventLogEntry

    key = asset_keys(hid)[2]
    data: Any = (AssetCheckEvaluationPlanned(asset_key=key, check_name=CHECK_NO_FAILED)
                 if passed is None else
                 dg.AssetCheckEvaluation(asset_key=key, check_name=CHECK_NO_FAILED,
                                         passed=passed, severity=dg.AssetCheckSeverity.WARN))
    kind = (DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED if passed is None
            else DagsterEventType.ASSET_CHECK_EVALUATION)
    event = DagsterEvent(event_type_value=kind.value, job_name="harvest_oaipmh_records_" + hid,
                         event_specific_data=data)
    instance.store_event(EventLogEntry(error_info=None, level=logging.INFO, user_message="",
                                       run_id=run_id, timestamp=time.time(),
                                       dagster_event=event))


def test_a_check_failing_run_after_run_is_posted_once(
        receiver: Receiver, instance: dg.DagsterInstance) -> None:
    """While a run evaluates a check that failed before, the check is planned (its outcome
    unknown): it stays known as failed, and failing again is no new transition."""
    alpha = Harvester(id="alpha", base_url="http://127.0.0.1:9/oai", metadata_prefix="oai_dc")
    ticks = Ticks(instance, (alpha,))
    ticks.tick()
    for n in range(3):
        _check_in_run(instance, "alpha", f"run{n}", None)
        ticks.until_quiet()
        _check_in_run(instance, "alpha", f"run{n}", False)
        ticks.until_quiet()
    assert [r["body"]["kind"] for r in receiver.requests] == ["check_failed"]


def test_the_post_goes_through_the_environments_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment behind a proxy reaches its webhook through it, as a client would."""
    from oaipmh_dagster.defs.webhook import proxy_for

    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "https_proxy",
                 "http_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert proxy_for("https://hooks.example.org/x") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example.org:3128")
    assert proxy_for("https://hooks.example.org/x") == "http://proxy.example.org:3128"
    assert proxy_for("http://hooks.example.org/x") is None
    monkeypatch.setenv("NO_PROXY", "hooks.example.org")
    assert proxy_for("https://hooks.example.org/x") is None


def test_a_users_own_check_on_a_harvesters_asset_is_posted(
        receiver: Receiver, instance: dg.DagsterInstance) -> None:
    """A check the user merged into the location (on one of a harvester's assets) is
    watched like the built-in ones: its failure is posted once, named by the check."""
    alpha = Harvester(id="alpha", base_url="http://127.0.0.1:9/oai", metadata_prefix="oai_dc")
    records = asset_keys("alpha")[2]

    @dg.asset_check(asset=records, name="titles_present")
    def titles_present() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=True)

    repo = dg.Definitions.merge(build_definitions([alpha]),
                                dg.Definitions(asset_checks=[titles_present])
                                ).get_repository_def()
    ticks = Ticks(instance, (alpha,), repository_def=repo)
    ticks.tick()
    for _ in range(2):
        instance.report_runless_asset_event(dg.AssetCheckEvaluation(
            asset_key=records, check_name="titles_present", passed=False,
            severity=dg.AssetCheckSeverity.ERROR, description="12 records without a title"))
        ticks.until_quiet()
    assert [(r["body"]["kind"], r["body"]["check"], r["body"]["error"])
            for r in receiver.requests] == [
        ("check_failed", "titles_present", "failed (error); 12 records without a title")]
