"""`oaipmh_since_sensor`: publishes, per harvester of its code location, the since of
its last successful harvest. Its JSON cursor mirrors those dates (the contract: id ->
datestamp) and is where an operator may edit them in the UI; each change is published
as an observation of the harvester's `raw_records` asset, which runs read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from oaipmh_dagster import incremental
from oaipmh_dagster.contracts import ASSET_JOB_PREFIX, JOB_PREFIX, RAW_RECORDS, harvester_of
from oaipmh_dagster.dagster_parts.assets import asset_keys
from oaipmh_dagster.dagster_parts.since import (
    SENSOR_NAME,
    parse_cursor,
    published_state,
    read_sensor_cursor,
    run_since,
    since_observation,
)
from oaipmh_dagster.incremental import SinceState
from oaipmh_dagster.registry import Harvester

MAX_RUNS_PER_TICK = 500
# Harvesters whose cursor entry is refreshed from the published since per tick (so a
# `since set` from the CLI shows in the cursor), round robin: bounded work per tick.
REFRESH_PER_TICK = 50


@dataclass
class Tick:
    """What one evaluation decided: the new cursor, observations to report, log lines."""

    cursor: str
    events: list[dg.AssetObservation] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


class _Since:
    """The tick's view of each harvester's published since (read once, then updated)."""

    def __init__(self, instance: dg.DagsterInstance, harvesters: dict[str, Harvester]):
        self.instance = instance
        self.harvesters = harvesters
        self.states: dict[str, SinceState | None] = {}
        self.events: list[dg.AssetObservation] = []

    def get(self, hid: str) -> SinceState | None:
        if hid not in self.states:
            self.states[hid] = published_state(self.instance, asset_keys(hid)[1])[0]
        return self.states[hid]

    def publish(self, hid: str, state: SinceState) -> None:
        self.states[hid] = state
        self.events.append(since_observation(asset_keys(hid)[1], state.value, state.scope,
                                             state.source, operator=state.operator))

    def scope(self, hid: str) -> str:
        h = self.harvesters[hid]
        return incremental.scope(h.base_url, h.metadata_prefix, h.sets)


def evaluate(
    instance: dg.DagsterInstance, cursor: str | None, harvesters: Sequence[Harvester],
    location_name: str | None = None, now: datetime | None = None,
) -> Tick:
    """One tick: the operator's cursor edits, then successful runs since the watermark."""
    now = now or datetime.now(UTC)
    data, problems = parse_cursor(cursor)
    lines = [f"cursor problem: {p}" for p in problems]
    by_id = {h.id: h for h in harvesters}
    view = _Since(instance, by_id)
    since: dict[str, Any] = dict(data["since"])
    bare = "published" not in data and data.get("watermark") == "now"
    published: dict[str, Any] = dict(data.get("published") or {})
    if "published" not in data and not bare:  # a cursor of an older version: adopt it
        for hid, value in since.items():
            if (hid in by_id and incremental.readable(value) and view.get(hid) is None
                    and incremental.check_since(value, "cursor", now=now).verdict == "ok"):
                view.publish(hid, SinceState(value, view.scope(hid), False, now.timestamp(),
                                             "cursor (adopted)"))
            published[hid] = value
    for hid in sorted(set(since) | set(published)):
        if hid in by_id and since.get(hid) != published.get(hid):
            _edit(view, hid, since, published, now, lines)
    watermark, seen = _advance(instance, data, view, since, published, location_name, now,
                               lines)
    refresh = _refresh(view, since, published, int(data.get("refresh") or 0))
    new = json.dumps({"since": dict(sorted(since.items())),
                      "published": dict(sorted(published.items())),
                      "watermark": watermark, "seen": seen, "refresh": refresh},
                     sort_keys=True)
    return Tick(new, view.events, lines)


def _edit(view: _Since, hid: str, since: dict, published: dict, now: datetime,
          lines: list[str]) -> None:
    """Publish an operator's cursor edit of `hid`'s since (deleted: a reset), unless the
    one rule (`incremental.check_since`) refuses the date: then the published one stays."""
    value = since.get(hid)
    if value in (None, ""):
        view.publish(hid, SinceState(None, view.scope(hid), True, now.timestamp(),
                                     "operator (cursor edit: reset)"))
        lines.append(f"{hid}: since reset by a cursor edit: the next harvest is full")
        since.pop(hid, None)
        published.pop(hid, None)
        return
    check = (incremental.check_since(value, f"cursor edit of {hid}", now=now)
             if incremental.readable(value) else None)
    if check is not None and check.verdict == "ok":
        view.publish(hid, SinceState(value, view.scope(hid), True, now.timestamp(),
                                     "operator (cursor edit)"))
        lines.append(f"{hid}: since set to {value} by a cursor edit")
        published[hid] = value
        return
    why = (check.message if check is not None else
           f"{value!r} is not a datestamp (YYYY-MM-DD or YYYY-MM-DDThh:mm:ssZ)")
    lines.append(f"{hid}: ignored the cursor's value: {why}")
    if published.get(hid) is None:
        since.pop(hid, None)
    else:
        since[hid] = published[hid]


def _advance(
    instance: dg.DagsterInstance, data: dict[str, Any], view: _Since, since: dict,
    published: dict, location_name: str | None, now: datetime, lines: list[str],
) -> tuple[str | None, list[str]]:
    """Publish the since of successful runs finished after the watermark."""
    watermark = data.get("watermark")
    if watermark == "now":  # an operator's bare mapping: do not replay older runs
        watermark = now.isoformat()
    seen: list[str] = [s for s in data.get("seen") or [] if isinstance(s, str)]
    after = datetime.fromisoformat(watermark) if watermark else None
    records = instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS], updated_after=after),
        limit=MAX_RUNS_PER_TICK, order_by="update_timestamp", ascending=True,
    )
    for rec in records:
        run = rec.dagster_run
        stamp = rec.update_timestamp.astimezone(UTC)
        if after is None or stamp > after:
            after, seen = stamp, []
        if run.run_id in seen:
            continue
        seen.append(run.run_id)
        if not (run.job_name.startswith(JOB_PREFIX)
                or run.job_name.startswith(ASSET_JOB_PREFIX)):
            continue
        origin = run.remote_job_origin
        if origin is not None and location_name and origin.location_name != location_name:
            continue  # another code location's run: its own sensor takes it
        started = rec.start_time or rec.create_timestamp.timestamp()
        for event in instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        ).records:
            mat = event.event_log_entry.asset_materialization
            hid = harvester_of(mat.asset_key.path, RAW_RECORDS) if mat is not None else None
            if mat is None or hid is None or hid not in view.harvesters:
                continue
            value, scope = run_since(mat.metadata)
            if value is None:
                continue
            state = incremental.after_run(view.get(hid), value, scope, started,
                                          event.event_log_entry.timestamp,
                                          f"run {run.run_id[:8]}")
            if state is None:
                lines.append(f"{hid}: run {run.run_id[:8]} leaves since as it is (it "
                             "started before an operator's edit, or is not newer)")
                continue
            view.publish(hid, state)
            lines.append(f"{hid}: since -> {value} (run {run.run_id[:8]})")
            since[hid] = published[hid] = value
    return (after.isoformat() if after else watermark), seen


def _refresh(view: _Since, since: dict, published: dict, offset: int) -> int:
    """Mirror the published since of a slice of harvesters into the cursor."""
    ids = sorted(view.harvesters)
    if not ids:
        return 0
    offset %= len(ids)
    for hid in (ids[offset:] + ids[:offset])[:REFRESH_PER_TICK]:
        if any(e.asset_key.path[1] == hid for e in view.events):
            continue
        state = view.get(hid)
        if state is None:
            continue
        if state.value:
            since[hid] = published[hid] = state.value
        else:
            since.pop(hid, None)
            published.pop(hid, None)
    return (offset + REFRESH_PER_TICK) % len(ids)


def report(instance: dg.DagsterInstance, tick: Tick) -> None:
    """Report a tick's observations as the sensor daemon does (tests, tools)."""
    for event in tick.events:
        instance.report_runless_asset_event(event)


def build_since_sensor(
    harvesters: Sequence[Harvester], location_name: str | None = None
) -> dg.SensorDefinition:
    """The plain `@dg.sensor` that owns its cursor (run_status_sensor would own it)."""
    rows = list(harvesters)

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=15,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Publishes each harvester's since: the server's responseDate at the start of "
            "its last successful harvest of the harvester's whole selection, in the "
            "server's granularity, as an observation of its raw_records asset. The JSON "
            'cursor mirrors them as {"since": {harvester: datestamp}, ...}: edit a date '
            "there (or delete it for a full harvest) to steer the next run; runs that "
            "started before the edit do not undo it."
        ),
    )
    def oaipmh_since_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        tick = evaluate(context.instance, context.cursor, rows, location_name)
        stored = read_sensor_cursor(context.instance, location_name) if location_name else None
        if stored is not None and stored != context.cursor:
            # Edited while this tick ran: keep the edit (the daemon writes back the cursor
            # a tick returns) and read it on the next tick.
            return dg.SensorResult(cursor=stored, skip_reason="the cursor was edited during "
                                   "this tick: it is kept and read on the next tick")
        for line in tick.lines:
            context.log.info(line)
        changes = [line for line in tick.lines if "since" in line]
        return dg.SensorResult(
            cursor=tick.cursor, asset_events=tick.events,
            skip_reason="; ".join(changes) if changes else "no newly successful harvest runs",
        )

    return oaipmh_since_sensor
