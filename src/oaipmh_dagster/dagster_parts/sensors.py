"""`oaipmh_since_sensor`: remembers, per harvester, the server date of its last
successful harvest. Its JSON cursor is the source of every incremental `since`."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import dagster as dg

from oaipmh_dagster.dagster_parts.jobs import HARVESTER_TAG
from oaipmh_dagster.dagster_parts.since import (
    ADVANCES_SINCE_KEY,
    RESPONSE_DATE_KEY,
    SENSOR_NAME,
    parse_cursor,
)
from oaipmh_dagster.oai import parse_datestamp

MAX_RUNS_PER_TICK = 500


def _later(a: str | None, b: str) -> bool:
    """Whether datestamp `b` is later than `a`."""
    if not a:
        return True
    try:
        return parse_datestamp(b) > parse_datestamp(a)
    except Exception:  # noqa: BLE001 - an operator-typed value may be junk: replace it
        return True


def run_response_date(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """`oai/response_date` of the raw_records materialization of a run, when that run
    may advance since (not an `oai_ids` or `until`-bounded run)."""
    from dagster._core.events import DagsterEventType

    records = instance.get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION
    ).records
    for record in records:
        event = record.event_log_entry.dagster_event
        mat = event.event_specific_data.materialization if event else None
        if mat is None or mat.asset_key.path[-1] != "raw_records":
            continue
        meta = mat.metadata
        adv = meta.get(ADVANCES_SINCE_KEY)
        if adv is not None and not adv.value:
            return None
        value = meta.get(RESPONSE_DATE_KEY)
        return str(value.value) if value is not None and value.value else None
    return None


def advance_cursor(instance: dg.DagsterInstance, cursor: str | None) -> tuple[str, list[str]]:
    """Process SUCCESS runs finished after the watermark; return the new cursor and a
    description of each change."""
    data = parse_cursor(cursor)
    since: dict[str, str] = data["since"]
    watermark = data.get("watermark")
    if watermark == "now":  # an operator's bare mapping: do not replay older runs
        watermark = datetime.now(UTC).isoformat()
    seen: list[str] = list(data.get("seen") or [])
    after = datetime.fromisoformat(watermark) if watermark else None
    records = instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS], updated_after=after),
        limit=MAX_RUNS_PER_TICK,
        order_by="update_timestamp",
        ascending=True,
    )
    changes = []
    for rec in records:
        run = rec.dagster_run
        harvester_id = run.tags.get(HARVESTER_TAG)
        stamp = rec.update_timestamp.astimezone(UTC)
        if after is None or stamp > after:
            after, seen = stamp, []
        if run.run_id in seen:
            continue
        seen.append(run.run_id)
        if not harvester_id:
            continue
        value = run_response_date(instance, run.run_id)
        if value and _later(since.get(harvester_id), value):
            changes.append(f"{harvester_id}: {since.get(harvester_id)} -> {value} "
                           f"(run {run.run_id[:8]})")
            since[harvester_id] = value
    new = {"since": dict(sorted(since.items())),
           "watermark": after.isoformat() if after else watermark, "seen": seen}
    return json.dumps(new, sort_keys=True), changes


def build_since_sensor() -> dg.SensorDefinition:
    """The plain `@dg.sensor` that owns its cursor (run_status_sensor would own it)."""

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=15,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Keeps each harvester's last successful datestamp (the server's responseDate at "
            "the start of that run, in the server's granularity) in its JSON cursor "
            '{"since": {harvester: datestamp}, "watermark": ...}. Only runs that ended in '
            "SUCCESS advance it. Edit the cursor to re-harvest a harvester from a date."
        ),
    )
    def oaipmh_since_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        new, changes = advance_cursor(context.instance, context.cursor)
        if new != context.cursor:
            context.update_cursor(new)
        for line in changes:
            context.log.info("since advanced: %s", line)
        return dg.SkipReason(
            "; ".join(changes) if changes else "no newly successful harvest runs"
        )

    return oaipmh_since_sensor
