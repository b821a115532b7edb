"""What `harvester list` shows beside each registry row, read from the Dagster instance:
the schedule's state, the last run, and the since the next run would use."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from oaipmh_dagster.contracts import HARVESTER_TAG
from oaipmh_dagster.defs._private import stored_schedule_statuses
from oaipmh_dagster.storage.registry import Harvester

__all__ = ["harvester_states", "last_run", "schedule_label", "stored_schedule_statuses"]


def schedule_label(h: Harvester, stored: str | None) -> str:
    """"no cron" (nothing is ever scheduled), else "on" or "off": the stored status, or
    the default (on when enabled)."""
    if not h.cron:
        return "no cron"
    if stored is not None:
        return "on" if stored == "RUNNING" else "off"
    return "on" if h.enabled else "off"


def _utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def last_run(instance: dg.DagsterInstance, harvester_id: str) -> dict[str, Any] | None:
    """The newest run of the harvester: {run_id, status, at} (at: end, else start, else
    creation time, UTC), or None."""
    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={HARVESTER_TAG: harvester_id}), limit=1)
    if not records:
        return None
    record = records[0]
    at = record.end_time or record.start_time or record.create_timestamp.timestamp()
    return {"run_id": record.dagster_run.run_id, "status": record.dagster_run.status.value,
            "at": _utc(at)}


def harvester_states(instance: dg.DagsterInstance,
                     harvesters: Sequence[Harvester]) -> dict[str, dict[str, Any]]:
    """id -> {schedule, last_run, since} (since None: the next run is a full harvest).
    A harvester none of whose assets has an event yet has had no run (a run plans its
    assets when it is created): its run and since queries are skipped."""
    from oaipmh_dagster.defs.assets import asset_keys
    from oaipmh_dagster.defs.since import current_states, resolve_since

    stored = stored_schedule_statuses(instance)
    keys = {h.id: asset_keys(h.id) for h in harvesters}
    entries = {r.asset_entry.asset_key: r.asset_entry for r in instance.get_asset_records(
        [key for three in keys.values() for key in three])}
    raw_known = [keys[h.id][1] for h in harvesters if keys[h.id][1] in entries]
    states = current_states(instance, raw_known, {
        key: entries[key].last_materialization_storage_id for key in raw_known})
    out = {}
    for h in harvesters:
        raw_key = keys[h.id][1]
        seen = any(key in entries for key in keys[h.id])
        since = resolve_since(instance, h, since=None, full=False, raw_key=raw_key,
                              state=states.get(raw_key))
        out[h.id] = {"schedule": schedule_label(h, stored.get(h.job_name)),
                     "last_run": last_run(instance, h.id) if seen else None,
                     "since": since.value}
    return out
