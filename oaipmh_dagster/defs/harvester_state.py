"""What `harvester list` shows beside each registry row, read from the Dagster instance:
the schedule's state, the last run, and the since the next run would use."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from oaipmh_dagster.contracts import ASSET_PREFIX, HARVESTER_TAG
from oaipmh_dagster.defs._private import stored_schedule_statuses
from oaipmh_dagster.defs.asset_events import newest_runs
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


def _described(record: Any) -> dict[str, Any] | None:
    """{run_id, status, at} of a run record (at: end, else start, else creation time,
    UTC)."""
    if record is None:
        return None
    at = record.end_time or record.start_time or record.create_timestamp.timestamp()
    return {"run_id": record.dagster_run.run_id, "status": record.dagster_run.status.value,
            "at": _utc(at)}


def last_run(instance: dg.DagsterInstance, harvester_id: str) -> dict[str, Any] | None:
    """The newest run of the harvester: {run_id, status, at}, or None."""
    return _described(newest_runs(instance, HARVESTER_TAG, [harvester_id]).get(harvester_id))


def harvester_states(instance: dg.DagsterInstance,
                     harvesters: Sequence[Harvester]) -> dict[str, dict[str, Any]]:
    """id -> {schedule, last_run, since} (since None: the next run is a full harvest).
    A harvester none of whose assets has an event yet has had no run (a run plans its
    assets when it is created): it is left out of the run and since queries. Every
    harvester's since and newest run are read at once (`current_states`, `newest_runs`):
    a few queries per 2,000 harvesters."""
    from oaipmh_dagster.defs.assets import asset_keys
    from oaipmh_dagster.defs.since import current_states, resolve_since

    stored = stored_schedule_statuses(instance)
    keys = {h.id: asset_keys(h.id) for h in harvesters}
    known = set(instance.get_asset_keys(prefix=[ASSET_PREFIX])) if harvesters else set()
    seen = [h.id for h in harvesters if any(key in known for key in keys[h.id])]
    states = current_states(instance, [keys[hid][1] for hid in seen])
    runs = newest_runs(instance, HARVESTER_TAG, seen)
    out = {}
    for h in harvesters:
        raw_key = keys[h.id][1]
        since = resolve_since(instance, h, since=None, full=False, raw_key=raw_key,
                              state=states.get(raw_key))
        out[h.id] = {"schedule": schedule_label(h, stored.get(h.job_name)),
                     "last_run": _described(runs.get(h.id)),
                     "since": since.value}
    return out
