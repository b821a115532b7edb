"""Alerts: a sensor that posts to a webhook each failed run of this code location, as JSON
`{kind: "run_failure", harvester, job, run_id, error, url}` (`url` links to the run in
the UI), and each harvester of it that turns bad: `raw_records` turning freshness FAIL
(`kind: "freshness_fail"`) or an asset check's evaluation failing (`kind:
"check_failed"`), as `{kind, harvester, asset, check, error, url}`, once per transition
(see `transitions`). Off unless `OAIPMH_ALERT_WEBHOOK` names the webhook when the code
location loads; the UI's address comes from `OAIPMH_DAGSTER_UI_URL` (else
`OAIPMH_DAGSTER_WEBSERVER`, else http://127.0.0.1:3000).

Each post has a total deadline (`OAIPMH_ALERT_TIMEOUT`, default 10 s, at most 15 s) and a
tick spends at most twice that on posts: alerts it has no time for wait for the next
tick. Every alert is tried once, at most: the cursor moves past each run tried and lists
each transition tried, delivered or not, and a failed delivery is logged (as a warning
and in the tick's message), never retried, since a receiver that took the alert but
answered late would get it twice. Messages name the webhook by its origin only
(`scheme://host:port`)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from oaipmh_dagster.contracts import HARVESTER_TAG, harvester_of
from oaipmh_dagster.defs.transitions import (
    FRESHNESS,
    Transition,
    failing_now,
    transitions,
)
from oaipmh_dagster.defs.webhook import origin, post_json

__all__ = ["ALERT_SENSOR_NAME", "TIMEOUT_ENV", "UI_URL_ENV", "WEBHOOK_ENV", "alert_payload",
           "build_alert_sensor", "evaluate"]

log = logging.getLogger(__name__)

WEBHOOK_ENV = "OAIPMH_ALERT_WEBHOOK"
TIMEOUT_ENV = "OAIPMH_ALERT_TIMEOUT"
UI_URL_ENV = "OAIPMH_DAGSTER_UI_URL"
WEBSERVER_ENV = "OAIPMH_DAGSTER_WEBSERVER"
DEFAULT_UI_URL = "http://127.0.0.1:3000"
ALERT_SENSOR_NAME = "oaipmh_run_failure_alert"
DEFAULT_TIMEOUT = 10.0
# Two posts at the longest deadline stay well below Dagster's 60 s sensor timeout.
MAX_TIMEOUT = 15.0
MAX_ALERTS_PER_TICK = 20
# Run failures read per tick (other locations' runs are passed over, not alerted).
FETCH_LIMIT = 200
INTERVAL_SECONDS = 30
# Longer errors are cut (a chat message or a ticket title, not a log).
MAX_ERROR = 2000
NOTHING_NEW = "no newly failed runs"


def ui_url() -> str:
    """The Dagster UI's base address, for links to runs."""
    base = os.environ.get(UI_URL_ENV) or os.environ.get(WEBSERVER_ENV) or DEFAULT_UI_URL
    return base.rstrip("/")


def deadline() -> float:
    """Seconds one post may take in all: `$OAIPMH_ALERT_TIMEOUT`, else 10 (a value that is
    not a number of seconds in (0, 15] is reported and the default used)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if 0 < value <= MAX_TIMEOUT:
        return value
    log.warning("%s=%r is not a number of seconds in (0, %g]: using %g s", TIMEOUT_ENV,
                raw, MAX_TIMEOUT, DEFAULT_TIMEOUT)
    return DEFAULT_TIMEOUT


def alert_payload(run: dg.DagsterRun, error: str) -> dict[str, Any]:
    """The JSON posted for a failed `run`."""
    return {"kind": "run_failure", "harvester": _harvesters(run), "job": run.job_name,
            "run_id": run.run_id,
            "error": error[:MAX_ERROR], "url": f"{ui_url()}/runs/{run.run_id}"}


def _harvesters(run: dg.DagsterRun) -> str | None:
    """The run's harvester: its tag, else (the asset graph's Materialize, a backfill) the
    harvesters of its assets."""
    harvester = run.tags.get(HARVESTER_TAG)
    if harvester is None:
        ids = {harvester_of(key.path) for key in run.asset_selection or ()} - {None}
        harvester = ", ".join(sorted(str(i) for i in ids)) or None
    return harvester


def run_error(instance: dg.DagsterInstance, run_id: str, failure: str | None) -> str:
    """The failed steps' errors (what raised, under Dagster's wrapping), else the run's
    failure message."""
    messages = []
    for record in instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records:
        event = record.event_log_entry.dagster_event
        error = event.step_failure_data.error if event is not None else None
        while error is not None and error.cause is not None:
            error = error.cause
        if event is not None and error is not None:
            messages.append(f"{event.step_key}: {error.message.strip()}")
    return "; ".join(messages) or failure or "run failed"


def _load(cursor: str | None) -> dict[str, Any]:
    try:
        data = json.loads(cursor) if cursor else None
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def parse_cursor(cursor: str | None) -> int | None:
    """The storage id of the last run failure tried, from this sensor's cursor
    (`{"after": id, ...}`) or the one Dagster's run-failure sensor kept (`record_id`)."""
    data = _load(cursor)
    value = data.get("after", data.get("record_id"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_failing(cursor: str | None) -> list[str] | None:
    """The cursor's harvesters known bad (`harvester/freshness`, `harvester/<check>`)."""
    value = _load(cursor).get("failing")
    if not isinstance(value, list):
        return None
    return [v for v in value if isinstance(v, str)]


def _ours(run: dg.DagsterRun, location_name: str | None, harvester_ids: frozenset[str]) -> bool:
    """Whether `run` belongs to this code location: launched from it, or launched from
    none (the CLI's in-process runs) for one of its harvesters."""
    origin_ = run.remote_job_origin
    if origin_ is not None:
        return location_name is None or origin_.location_name == location_name
    if location_name is None:
        return True
    named = _harvesters(run)
    return named is not None and any(h in harvester_ids for h in named.split(", "))


@dataclass
class AlertTick:
    """What one evaluation did: the cursor's state, log lines, what was sent."""

    after: int
    failing: list[str]
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sent: int = 0
    more: bool = False

    @property
    def cursor(self) -> str:
        return json.dumps({"after": self.after, "failing": sorted(set(self.failing))})

    def summary(self) -> str:
        """The tick's message in the UI."""
        parts = [f"{self.sent} alert(s) sent"] if self.sent else []
        parts += self.warnings
        if self.more:
            parts.append("more alerts wait for the next tick")
        return "; ".join(parts) or NOTHING_NEW


@dataclass(frozen=True)
class Scope:
    """Where alerts go and which runs and harvesters are this code location's."""

    webhook: str
    location_name: str | None = None
    harvester_ids: frozenset[str] = frozenset()
    # The location's asset checks (built-in and the user's own, merged in): those on a
    # harvester's assets are watched.
    check_keys: frozenset[dg.AssetCheckKey] = frozenset()


class _Budget:
    """A tick's time for posts: a post starts only while a whole deadline is left of
    twice the deadline, and at most MAX_ALERTS_PER_TICK start."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.began, self.tried = seconds, time.monotonic(), 0

    def take(self) -> bool:
        if (self.tried >= MAX_ALERTS_PER_TICK
                or time.monotonic() - self.began + self.seconds > 2 * self.seconds):
            return False
        self.tried += 1
        return True


def evaluate(instance: dg.DagsterInstance, cursor: str | None, scope: Scope,
             seconds: float | None = None) -> AlertTick:
    """One tick: post the harvesters newly bad (freshness FAIL, a failed check), then the
    run failures recorded after the cursor, within the tick's budget; the rest wait."""
    budget = _Budget(seconds or deadline())
    after, failing = parse_cursor(cursor), parse_failing(cursor)
    health = failing_now(instance, sorted(scope.harvester_ids), scope.check_keys)
    if after is None:  # first tick: alert what happens from now on, not history
        latest = instance.fetch_run_status_changes(dg.DagsterEventType.RUN_FAILURE, limit=1)
        start = latest.records[0].storage_id if latest.records else -1
        return AlertTick(start, [t.key for t in health.bad],
                         [f"alerts start after run failure record {start} and with "
                          f"{len(health.bad)} harvester problem(s) known"])
    if failing is None:  # a cursor of an older version: what is bad now is known
        failing = [t.key for t in health.bad]
    tick = AlertTick(after, [key for key in failing if health.keeps(key)])  # recovered: out
    for t in transitions(health.bad, failing):
        if not budget.take():
            tick.more = True  # not in `failing`: the next tick finds it again
            break
        _deliver(scope.webhook, transition_payload(t), f"alert for harvester {t.harvester} "
                 f"({t.what})", budget.seconds, tick)
        tick.failing.append(t.key)
    _run_failures(instance, scope, budget, tick)
    return tick


def _run_failures(instance: dg.DagsterInstance, scope: Scope, budget: _Budget,
                  tick: AlertTick) -> None:
    """Post the run failures after the cursor, each once, as the budget allows."""
    records = instance.fetch_run_status_changes(
        dg.RunStatusChangeRecordsFilter(dg.DagsterEventType.RUN_FAILURE,
                                        after_storage_id=tick.after),
        limit=FETCH_LIMIT, ascending=True).records
    for record in records:
        entry = record.event_log_entry
        run = instance.get_run_by_id(entry.run_id)
        if run is not None and _ours(run, scope.location_name, scope.harvester_ids):
            if not budget.take():
                tick.more = True
                return
            failure = entry.dagster_event.message if entry.dagster_event else None
            payload = alert_payload(run, run_error(instance, run.run_id, failure))
            _deliver(scope.webhook, payload, f"alert for run {run.run_id}", budget.seconds,
                     tick)
        tick.after = record.storage_id


def transition_payload(t: Transition) -> dict[str, Any]:
    """The JSON posted when harvester `t.harvester` turned bad."""
    path = "/".join(t.asset.path)
    check = t.what != FRESHNESS
    return {"kind": "check_failed" if check else "freshness_fail", "harvester": t.harvester,
            "asset": path, "check": t.what if check else None, "error": t.detail[:MAX_ERROR],
            "url": f"{ui_url()}/assets/{path}" + ("?view=checks" if check else "")}


def _deliver(webhook: str, payload: dict[str, Any], label: str, seconds: float,
             tick: AlertTick) -> None:
    """Post one alert; the outcome goes into the tick's lines, never the URL."""
    delivery = post_json(webhook, payload, seconds)
    target = origin(webhook)
    if delivery.ok:
        tick.sent += 1
        tick.lines.append(f"{label} sent to {target} ({delivery.reason})")
    else:
        tick.warnings.append(f"{label} NOT delivered to {target}: {delivery.reason}; "
                             "it is not retried")


def build_alert_sensor(harvesters: Iterable[Any] = (),
                       location_name: str | None = None) -> dg.SensorDefinition | None:
    """The alert sensor, when `OAIPMH_ALERT_WEBHOOK` is set; else None. It takes the runs
    of `location_name` (of in-process runs, those of `harvesters`) and the freshness and
    checks of `harvesters`."""
    if not os.environ.get(WEBHOOK_ENV):
        return None
    ids = frozenset(h.id for h in harvesters)

    @dg.sensor(
        name=ALERT_SENSOR_NAME,
        minimum_interval_seconds=INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Posts each failed run of this code location, and each of its "
        "harvesters turning freshness FAIL or failing an asset check, once to the webhook "
        f"in ${WEBHOOK_ENV} (JSON with a kind: run_failure, freshness_fail, check_failed), "
        f"each post within ${TIMEOUT_ENV} seconds; a failed delivery is logged, not "
        "retried.",
    )
    def oaipmh_run_failure_alert(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        webhook = os.environ.get(WEBHOOK_ENV)
        if not webhook:
            return dg.SensorResult(skip_reason=f"{WEBHOOK_ENV} is not set here: no alert sent")
        repo = context.repository_def
        checks = frozenset(repo.asset_graph.asset_check_keys) if repo is not None else frozenset()
        tick = evaluate(context.instance, context.cursor,
                        Scope(webhook, location_name, ids, checks))
        for line in tick.lines:
            context.log.info(line)
        for line in tick.warnings:
            context.log.warning(line)
        return dg.SensorResult(cursor=tick.cursor, skip_reason=tick.summary())

    return oaipmh_run_failure_alert
