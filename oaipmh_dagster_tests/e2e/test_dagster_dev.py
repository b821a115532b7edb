"""End to end: real `dagster dev` (webserver + daemon) against loopback OAI-PMH servers.

One `dagster dev` session per storage (SQLite, PostgreSQL) walks through: launching runs
over GraphQL; a run of a harvester whose row was deleted (old snapshot, no reload)
failing clearly; `reloadRepositoryLocation` dropping its job; `oaipmh-dagster harvester
add` reloading the location; the since sensor's cursor (each run's `oai/next_since`); an
incremental run fetching exactly the new records (`from=` in the server's granularity, at
the since for a harvester with `overlap` 0); a failed run leaving the window to the next
run; and a schedule toggled over GraphQL whose tick launches a run that resolves the
sensor's since when it starts (its tags show it; `from=` is one day earlier: the default
overlap at day granularity)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from oaipmh_dagster.defs.assets import op_name
from oaipmh_dagster.defs.jobs import SINCE_SOURCE_TAG, SINCE_TAG
from oaipmh_dagster.defs.since import (
    ADVANCES_SINCE_KEY,
    NEXT_SINCE_KEY,
    SENSOR_NAME,
)
from oaipmh_dagster.demo.dataset import DAY, SECONDS, ServedRecord, make_dataset
from oaipmh_dagster.storage.registry import Registry
from oaipmh_dagster_tests.e2e.conftest import (
    LOCATION,
    REPOSITORY,
    DagsterDev,
    wait_for,
)
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RUN_TIMEOUT = 120.0
SENSOR_TIMEOUT = 180.0  # the sensor ticks every 5 s here (conftest): room for a loaded machine
SCHEDULE_TIMEOUT = 150.0
SECONDS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
OAI_DC = ("<oai_dc:dc xmlns:oai_dc='http://www.openarchives.org/OAI/2.0/oai_dc/' "
          "xmlns:dc='http://purl.org/dc/elements/1.1/'><dc:title>{}</dc:title></oai_dc:dc>")
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}

LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on PipelineNotFoundError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message }
  }
}"""
RUN = """
query Run($id: ID!) {
  runOrError(runId: $id) { __typename ... on Run { status endTime } }
}"""
SCHEDULE = """
query Schedule($sel: ScheduleSelector!) {
  scheduleOrError(scheduleSelector: $sel) {
    __typename ... on Schedule { defaultStatus scheduleState { id status } }
  }
}"""
START_SCHEDULE = """
mutation Start($sel: ScheduleSelector!) {
  startSchedule(scheduleSelector: $sel) {
    __typename ... on ScheduleStateResult { scheduleState { id status } }
    ... on PythonError { message }
  }
}"""
STOP_SCHEDULE = """
mutation Stop($id: String!) {
  stopRunningSchedule(id: $id) {
    __typename ... on ScheduleStateResult { scheduleState { id status } }
    ... on PythonError { message }
  }
}"""
SENSOR = """
query Sensor($sel: SensorSelector!) {
  sensorOrError(sensorSelector: $sel) {
    __typename ... on Sensor { sensorState { status
      typeSpecificData { ... on SensorData { lastCursor } }
      ticks(limit: 10) { timestamp status } } }
  }
}"""
JOBS = """
query Jobs($sel: RepositorySelector!) {
  repositoryOrError(repositorySelector: $sel) {
    __typename ... on Repository { jobs { name } }
  }
}"""
RELOAD = """
mutation Reload($name: String!) {
  reloadRepositoryLocation(repositoryLocationName: $name) {
    __typename ... on WorkspaceLocationEntry { loadStatus }
    ... on PythonError { message }
  }
}"""
SCHEDULED_RUNS = """
query Runs($filter: RunsFilter!) {
  runsOrError(filter: $filter) {
    __typename ... on Runs { results { runId status creationTime runConfigYaml
                                       tags { key value } } }
  }
}"""


# -- helpers over GraphQL and the instance ------------------------------------------------


def job_name(harvester_id: str) -> str:
    return f"harvest_oaipmh_records_{harvester_id}"


def launch(dev: DagsterDev, harvester_id: str, config: dict[str, Any] | None = None) -> str:
    params = {
        "selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY,
                     "jobName": job_name(harvester_id)},
        "runConfigData": {"ops": {op_name(harvester_id): {"config": config or {}}}},
    }
    result = dev.graphql(LAUNCH, {"params": params})["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", result
    return result["run"]["runId"]


def run_status(dev: DagsterDev, run_id: str) -> dict[str, Any]:
    run = dev.graphql(RUN, {"id": run_id})["runOrError"]
    assert run["__typename"] == "Run", run
    return run


def wait_run(dev: DagsterDev, run_id: str, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
    """The run once finished (SUCCESS, FAILURE or CANCELED), as GraphQL shows it."""

    def finished() -> dict[str, Any] | None:
        run = run_status(dev, run_id)
        return run if run["status"] in TERMINAL else None

    return wait_for(f"run {run_id} to finish", finished, timeout,
                    on_timeout=lambda: run_text(dev, run_id) + "\n" + dev.log_tail())


def run_text(dev: DagsterDev, run_id: str) -> str:
    """Every log message and error (with causes) of a run, for assertions and reports."""
    parts: list[str] = []
    for entry in dev.instance().all_logs(run_id):
        parts.append(entry.user_message or "")
        event = entry.dagster_event
        error = getattr(event.event_specific_data, "error", None) if event else None
        while error is not None:
            parts.append(error.message)
            error = error.cause
    return "\n".join(parts)


def step_failed(dev: DagsterDev, run_id: str) -> bool:
    return any(e.dagster_event is not None and e.dagster_event.is_step_failure
               for e in dev.instance().all_logs(run_id))


def assert_success(dev: DagsterDev, run_id: str) -> None:
    status = wait_run(dev, run_id)["status"]
    assert status == "SUCCESS", f"run {run_id}: {status}\n{run_text(dev, run_id)}"


def raw_metadata(dev: DagsterDev, run_id: str) -> dict[str, Any]:
    """The raw_records materialization metadata of a run, as plain values."""
    from dagster._core.events import DagsterEventType

    for record in dev.instance().get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION
    ).records:
        mat = record.event_log_entry.dagster_event.event_specific_data.materialization
        if mat.asset_key.path[-1] == "raw_records":
            return {k: v.value for k, v in mat.metadata.items()}
    pytest.fail(f"run {run_id} materialized no raw_records")


def run_next_since(dev: DagsterDev, run_id: str) -> str:
    """The since a successful run recorded (`oai/next_since` of its raw_records), which
    must be one that advances since."""
    meta = raw_metadata(dev, run_id)
    assert meta[ADVANCES_SINCE_KEY] is True, meta
    value = meta[NEXT_SINCE_KEY]
    assert value, meta
    return value


def run_tags(dev: DagsterDev, run_id: str) -> dict[str, str]:
    return dict(dev.instance().get_run_by_id(run_id).tags)


def sensor_state(dev: DagsterDev) -> dict[str, Any]:
    sel = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY,
           "sensorName": SENSOR_NAME}
    sensor = dev.graphql(SENSOR, {"sel": sel})["sensorOrError"]
    assert sensor["__typename"] == "Sensor", sensor
    return sensor["sensorState"]


def cursor_since(dev: DagsterDev) -> dict[str, str]:
    """The since sensor's cursor entries, as GraphQL shows them."""
    raw = (sensor_state(dev)["typeSpecificData"] or {}).get("lastCursor")
    return json.loads(raw)["since"] if raw else {}


def wait_cursor(dev: DagsterDev, harvester_id: str, value: str) -> None:
    wait_for(f"the since sensor to record {harvester_id}={value}",
             lambda: cursor_since(dev).get(harvester_id) == value, SENSOR_TIMEOUT,
             interval=2.0, on_timeout=lambda: f"cursor: {cursor_since(dev)}\n{dev.log_tail()}")


def schedule_selector(harvester_id: str) -> dict[str, str]:
    return {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY,
            "scheduleName": job_name(harvester_id)}


def schedule_state(dev: DagsterDev, harvester_id: str) -> dict[str, Any]:
    schedule = dev.graphql(SCHEDULE, {"sel": schedule_selector(harvester_id)})["scheduleOrError"]
    assert schedule["__typename"] == "Schedule", schedule
    return schedule


def stored_schedule_status(dev: DagsterDev, harvester_id: str) -> str | None:
    """The schedule's status in the instance's storage (None: no stored state)."""
    from dagster._core.scheduler.instigation import InstigatorType

    states = [s for s in dev.instance().all_instigator_state(
        instigator_type=InstigatorType.SCHEDULE) if s.name == job_name(harvester_id)]
    assert len(states) <= 1, states
    return states[0].status.value if states else None


def jobs(dev: DagsterDev) -> set[str]:
    sel = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
    repo = dev.graphql(JOBS, {"sel": sel})["repositoryOrError"]
    assert repo["__typename"] == "Repository", repo
    return {j["name"] for j in repo["jobs"]}


def list_froms(server: OAIServer) -> list[list[str]]:
    """`from` arguments of the first page of each ListRecords request."""
    return [r.params.get("from", []) for r in server.requests
            if r.verb == "ListRecords" and "resumptionToken" not in r.params]


def parse_stamp(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def day_before(value: str) -> str:
    """The `from` of a day-granularity since asked with the default overlap (one day)."""
    return (datetime.strptime(value, "%Y-%m-%d") - timedelta(days=1)).strftime("%Y-%m-%d")


def new_records(tag: str, when: list[datetime]) -> list[ServedRecord]:
    return [ServedRecord(f"oai:e2e.example.org:{tag}-{i}", stamp, ("e2e",),
                         metadata={"oai_dc": OAI_DC.format(f"{tag} {i}")})
            for i, stamp in enumerate(when)]


# -- the session ------------------------------------------------------------------------


def test_dagster_dev_end_to_end(start_dagster_dev, tmp_path: Path) -> None:  # noqa: ANN001
    secs = OAIServer(make_dataset(300, seed=5, granularity=SECONDS), page_size=100).start()
    days = OAIServer(make_dataset(60, seed=6, granularity=DAY), page_size=100).start()
    try:
        # overlap 0: its incremental runs ask `from` exactly at the recorded since.
        add_harvester("e2e_manual", secs.base_url, max_retries=0, timeout=10.0, overlap=0)
        add_harvester("e2e_cron", days.base_url, cron="* * * * *", enabled=True)
        add_harvester("e2e_gone", secs.base_url)
        step = Steps()
        step("0. start dagster dev")
        dev = start_dagster_dev()
        _session(dev, secs, days, step)
        step("done")
    finally:
        secs.stop()
        days.stop()


class Steps:
    """Prints when each step starts (pytest shows it with a failure; `-s` shows it live)."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, name: str) -> None:
        print(f"[e2e {time.monotonic() - self.start:6.1f} s] {name}", flush=True)


def _session(dev: DagsterDev, secs: OAIServer, days: OAIServer, step: Steps) -> None:
    step("1. stop the default-running schedule")
    # 1. The enabled cron harvester's schedule runs by default; stop it over GraphQL
    #    (kept stopped until the sensor knows its since) and see the stored state.
    schedule = schedule_state(dev, "e2e_cron")
    assert schedule["defaultStatus"] == "RUNNING"
    assert schedule["scheduleState"]["status"] == "RUNNING"
    stopped = dev.graphql(STOP_SCHEDULE, {"id": schedule["scheduleState"]["id"]})
    assert stopped["stopRunningSchedule"]["__typename"] == "ScheduleStateResult", stopped
    assert schedule_state(dev, "e2e_cron")["scheduleState"]["status"] == "STOPPED"
    assert stored_schedule_status(dev, "e2e_cron") == "STOPPED"

    step("2. runs over GraphQL, one of a deleted row")
    # 2. Delete a row behind the webserver's back (no reload) and launch runs over GraphQL.
    Registry().remove("e2e_gone")
    first_manual = launch(dev, "e2e_manual")
    first_cron = launch(dev, "e2e_cron")
    gone = launch(dev, "e2e_gone")
    assert_success(dev, first_manual)
    assert_success(dev, first_cron)
    assert wait_run(dev, gone)["status"] == "FAILURE"
    text = run_text(dev, gone)
    assert "was removed from the registry" in text, text
    assert step_failed(dev, gone), "the run must load its code and fail in the step"

    step("3. reload drops the deleted harvester")
    # 3. Reload over GraphQL: the removed harvester's job is gone.
    assert job_name("e2e_gone") in jobs(dev)
    reloaded = dev.graphql(RELOAD, {"name": LOCATION})["reloadRepositoryLocation"]
    assert reloaded["__typename"] == "WorkspaceLocationEntry", reloaded
    wait_for("the reloaded location to drop e2e_gone",
             lambda: job_name("e2e_gone") not in jobs(dev), 60)
    assert {job_name("e2e_manual"), job_name("e2e_cron")} <= jobs(dev)

    step("4. CLI harvester add reloads")
    # 4. `oaipmh-dagster harvester add` reloads the running webserver's location.
    cli = Path(sys.executable).with_name("oaipmh-dagster")
    added = subprocess.run(
        [str(cli), "harvester", "add", "e2e_new", "--url", secs.base_url, "--prefix", "oai_dc"],
        env=dev.env(), capture_output=True, text=True, timeout=120, check=False)
    assert added.returncode == 0, added.stdout + added.stderr
    assert "reloaded code location" in added.stdout + added.stderr, added.stdout + added.stderr
    wait_for("the new harvester's job", lambda: job_name("e2e_new") in jobs(dev), 60)

    step("5. sensor cursor")
    # 5. The since sensor publishes each successful run's `oai/next_since` (the server's
    #    date at the start of its lists), in the server's granularity.
    since_manual = run_next_since(dev, first_manual)
    since_cron = run_next_since(dev, first_cron)
    assert SECONDS_RE.match(since_manual), since_manual
    assert DAY_RE.match(since_cron), since_cron
    meta = raw_metadata(dev, first_manual)
    assert (meta["oai/mode"], meta["oai/since_source"]) == ("full", "none")
    assert meta["records"] == len(secs.dataset)
    assert run_tags(dev, first_manual)[SINCE_TAG] == "full"
    wait_cursor(dev, "e2e_manual", since_manual)
    wait_cursor(dev, "e2e_cron", since_cron)

    step("6. start the schedule")
    # 6. Start the schedule again (stored RUNNING); its next tick must carry that since.
    days.dataset.add(new_records("today", [datetime.now(UTC)])[0])
    scheduled_after = time.time()
    started = dev.graphql(START_SCHEDULE, {"sel": schedule_selector("e2e_cron")})
    assert started["startSchedule"]["__typename"] == "ScheduleStateResult", started
    assert schedule_state(dev, "e2e_cron")["scheduleState"]["status"] == "RUNNING"
    assert stored_schedule_status(dev, "e2e_cron") == "RUNNING"
    days.clear_log()

    step("7. incremental run")
    # 7. New records on the server: the next (launchpad default) run fetches exactly them.
    second_batch = new_records("second", [parse_stamp(since_manual) + timedelta(seconds=1)] * 3)
    secs.dataset.extend(second_batch)
    secs.clear_log()
    second = launch(dev, "e2e_manual")
    assert_success(dev, second)
    assert list_froms(secs) == [[since_manual]]  # overlap 0: exactly at the since
    meta = raw_metadata(dev, second)
    assert (meta["oai/since_source"], meta["oai/since"]) == ("run", since_manual)
    assert (meta["oai/mode"], meta["records"], meta["new"]) == ("incremental", 3, 3)
    tags = run_tags(dev, second)
    assert (tags[SINCE_TAG], tags[SINCE_SOURCE_TAG]) == (since_manual, "run")
    since_second = run_next_since(dev, second)
    assert SECONDS_RE.match(since_second), since_second
    assert parse_stamp(since_second) > parse_stamp(since_manual), "since did not advance"
    wait_cursor(dev, "e2e_manual", since_second)

    step("8. failed run, then recovery")
    # 8. A failed run does not advance since: the next run re-covers the window.
    third_batch = new_records("third", [parse_stamp(since_second),
                                        parse_stamp(since_second) + timedelta(seconds=1)])
    secs.dataset.extend(third_batch)
    secs.faults.add("status", status=500, times=None)
    failed = launch(dev, "e2e_manual")
    failed_run = wait_run(dev, failed)
    secs.faults.clear()
    assert failed_run["status"] == "FAILURE", run_text(dev, failed)
    wait_for("a since sensor tick after the failed run",
             lambda: any(t["timestamp"] > failed_run["endTime"]
                         for t in sensor_state(dev)["ticks"]),
             SENSOR_TIMEOUT, interval=2.0, on_timeout=dev.log_tail)
    assert cursor_since(dev)["e2e_manual"] == since_second
    secs.clear_log()
    recovered = launch(dev, "e2e_manual")
    assert_success(dev, recovered)
    assert list_froms(secs) == [[since_second]]
    meta = raw_metadata(dev, recovered)
    assert (meta["oai/since_source"], meta["records"], meta["new"]) == ("run", 2, 2)
    wait_cursor(dev, "e2e_manual", run_next_since(dev, recovered))

    step("9. scheduled run")
    # 9. The schedule's tick launched a run with no since in its config: the op resolved
    #    the sensor's since when the run started (tags), and asked a day before it.
    tag = {"key": "dagster/schedule_name", "value": job_name("e2e_cron")}

    def scheduled_run() -> dict[str, Any] | None:
        runs = dev.graphql(SCHEDULED_RUNS, {"filter": {"tags": [tag]}})["runsOrError"]
        fresh = [r for r in runs["results"] if r["creationTime"] >= scheduled_after]
        return min(fresh, key=lambda r: r["creationTime"]) if fresh else None

    ticked = wait_for("a scheduled run of e2e_cron", scheduled_run,
                      max(10.0, SCHEDULE_TIMEOUT - (time.time() - scheduled_after)),
                      interval=3.0, on_timeout=dev.log_tail)
    assert_success(dev, ticked["runId"])
    config = dev.instance().get_run_by_id(ticked["runId"]).run_config
    op_config = (config.get("ops") or {}).get(op_name("e2e_cron"), {}).get("config") or {}
    assert not op_config.get("since") and not op_config.get("full"), config
    tags = run_tags(dev, ticked["runId"])
    assert (tags[SINCE_TAG], tags[SINCE_SOURCE_TAG]) == (since_cron, "run"), tags
    assert list_froms(days)[0] == [day_before(since_cron)]
    meta = raw_metadata(dev, ticked["runId"])
    assert (meta["oai/mode"], meta["oai/since"], meta["records"]) == (
        "incremental", day_before(since_cron), 1)

    step("10. stop the schedule")
    # 10. Stop it again over GraphQL: stored STOPPED.
    state_id = schedule_state(dev, "e2e_cron")["scheduleState"]["id"]
    stopped = dev.graphql(STOP_SCHEDULE, {"id": state_id})
    assert stopped["stopRunningSchedule"]["scheduleState"]["status"] == "STOPPED"
    assert stored_schedule_status(dev, "e2e_cron") == "STOPPED"
