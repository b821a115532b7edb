"""Where a run's `since` comes from, in one place for schedules, UI launches and the CLI:
explicit run config > `full` > the since sensor's cursor > the last successful
materialization's `oai/response_date` > none (a full harvest)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import dagster as dg

SENSOR_NAME = "oaipmh_since_sensor"
RESPONSE_DATE_KEY = "oai/response_date"
ADVANCES_SINCE_KEY = "oai/advances_since"


@dataclass(frozen=True)
class ResolvedSince:
    """The `since` of a run and where it came from (for the run's logs)."""

    value: str | None
    source: str  # run_config | full | sensor_cursor | last_materialization | none


def parse_cursor(cursor: str | None) -> dict[str, Any]:
    """The since sensor's cursor as a dict: {"since": {id: datestamp}, "watermark": ...}.

    An operator may also type a bare mapping {id: datestamp} in the UI; it has no
    watermark, so it comes back with `"watermark": "now"`: only runs that succeed after
    the edit may move those dates again."""
    if not cursor:
        return {"since": {}, "watermark": None}
    try:
        data = json.loads(cursor)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the {SENSOR_NAME} cursor is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"the {SENSOR_NAME} cursor must be a JSON object")
    if "since" not in data:
        data = {"since": data, "watermark": "now"}
    data.setdefault("watermark", None)
    return data


def read_sensor_cursor(instance: dg.DagsterInstance, location_name: str | None) -> str | None:
    """The stored cursor of the since sensor of `location_name` (any location when None
    and only one has the sensor). Uses Dagster's instigator storage, which is not public
    API: kept in this one function, covered by a test."""
    from dagster._core.scheduler.instigation import InstigatorType

    states = [
        s for s in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
        if s.name == SENSOR_NAME
    ]
    if location_name is not None:
        matching = [
            s for s in states
            if s.origin.repository_origin.code_location_origin.location_name == location_name
        ]
        states = matching or (states if len(states) == 1 else [])
    if len(states) != 1:
        return None
    data = states[0].instigator_data
    return getattr(data, "cursor", None)


def last_materialized_response_date(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey
) -> str | None:
    """`oai/response_date` of the newest materialization that may advance since."""
    records = instance.fetch_materializations(asset_key, limit=20).records
    for record in records:
        mat = record.asset_materialization
        if mat is None:
            continue
        meta = mat.metadata
        advances = meta.get(ADVANCES_SINCE_KEY)
        if advances is not None and not advances.value:
            continue
        value = meta.get(RESPONSE_DATE_KEY)
        if value is not None and value.value:
            return str(value.value)
    return None


def resolve_since(
    instance: dg.DagsterInstance,
    harvester_id: str,
    *,
    since: str | None,
    full: bool,
    raw_asset_key: dg.AssetKey,
    location_name: str | None,
) -> ResolvedSince:
    """The one since-resolution rule (see the module docstring)."""
    if since:
        return ResolvedSince(since, "run_config")
    if full:
        return ResolvedSince(None, "full")
    cursor = parse_cursor(read_sensor_cursor(instance, location_name))
    value = cursor["since"].get(harvester_id)
    if value:
        return ResolvedSince(str(value), "sensor_cursor")
    value = last_materialized_response_date(instance, raw_asset_key)
    if value:
        return ResolvedSince(value, "last_materialization")
    return ResolvedSince(None, "none")
