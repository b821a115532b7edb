"""Where a run's `since` comes from, in one place for schedules, UI launches, the
implicit asset job, backfills and the CLI.

The since in force for a harvester is published as an `AssetObservation` of its
`raw_records` asset (by the since sensor, or by an operator's `since set`/`reset`),
plus any newer `raw_records` materialization of a successful run that the sensor has not
published yet. Both are read with public instance queries. Precedence for one run:
explicit run config > `full` > the since in force for the harvester's current selection
> none (a full harvest)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum, auto
from typing import Any

import dagster as dg

from oaipmh_dagster.contracts import (
    ADVANCES_SINCE_KEY,
    MODE_FULL,
    MODE_INCREMENTAL,
    NEXT_SINCE_KEY,
    OPERATOR_KEY,
    RESPONSE_DATE_KEY,
    SCOPE_KEY,
    SENSOR_NAME,
    SINCE_KEY,
    SINCE_SOURCE_KEY,
)
from oaipmh_dagster.defs import asset_events
from oaipmh_dagster.harvesting import incremental
from oaipmh_dagster.harvesting.incremental import SinceState
from oaipmh_dagster.harvesting.plan import SinceChoice
from oaipmh_dagster.oai import parse_user_datetime
from oaipmh_dagster.storage.registry import Harvester

__all__ = ["SENSOR_NAME", "ResolvedSince", "SinceSource", "current_state", "current_states",
           "parse_cursor", "published_state", "published_states", "resolve_since", "run_mode",
           "run_since", "set_since", "since_observation", "since_report"]

# How many newer materializations a resolution looks at past the last published since.
_MATERIALIZATIONS = 20


class SinceSource(StrEnum):
    """Where a run's since came from (its value is the `oaipmh/since_source` tag and the
    `oai/since_source` metadata)."""

    RUN_CONFIG = "run_config"
    FULL = "full"
    RUN = "run"
    OPERATOR = "operator"
    NONE = "none"
    SCOPE_CHANGED = "scope_changed"


@dataclass(frozen=True)
class ResolvedSince:
    """The `since` of a run, where it came from (`kind`; `source` is its value, a plain
    str for tags and metadata), and what it means for the run."""

    value: str | None
    kind: SinceSource
    overlap: bool = False  # ask a little earlier (a since recorded by a run)
    stored: str | None = None  # the since in force for the harvester's selection
    note: str = ""
    origin: str = ""  # who recorded a stored since (e.g. "run 1a2b3c4d", "operator (...)")

    @property
    def source(self) -> str:
        """`kind` as a plain str (Dagster's tags and metadata serialize no enum)."""
        return self.kind.value

    def label(self) -> str | None:
        """Where a remembered since came from, for the one rule's messages (None: the
        run's own since, from its run config)."""
        if self.kind is SinceSource.RUN_CONFIG or self.value is None:
            return None
        verb = "set by" if self.kind is SinceSource.OPERATOR else "recorded by"
        return f"since {verb} {self.origin or self.source}"

    def choice(self, full: bool) -> SinceChoice:
        """What the harvest takes from this resolution (`full`: the run config's)."""
        return SinceChoice(self.value, full or self.value is None, self.overlap, self.label())

    def covers_stored(self) -> bool:
        """Whether a run from this since covers everything after the stored since (an
        explicit since later than the stored one leaves a gap)."""
        if self.kind is not SinceSource.RUN_CONFIG or self.value is None:
            return True
        if self.stored is None:
            return False
        return parse_user_datetime(self.value) <= parse_user_datetime(self.stored)


def _text(meta: Any, key: str) -> str | None:
    value = meta.get(key)
    value = getattr(value, "value", value)
    return str(value) if value not in (None, "") else None


def _flag(meta: Any, key: str) -> bool | None:
    value = meta.get(key)
    value = getattr(value, "value", value)
    return None if value is None else bool(value)


def observation_state(record: Any) -> SinceState | None:
    """The since an observation record publishes (None: not a since observation)."""
    obs = record.asset_observation
    if obs is None or SINCE_KEY not in obs.metadata:
        return None
    meta = obs.metadata
    return SinceState(
        value=incremental.readable(_text(meta, SINCE_KEY)),
        scope=_text(meta, SCOPE_KEY),
        operator=bool(_flag(meta, OPERATOR_KEY)),
        at=record.timestamp,
        source=_text(meta, SINCE_SOURCE_KEY) or "unknown",
    )


def run_since(meta: Any) -> tuple[str | None, str | None]:
    """(since, scope) a raw_records materialization may record; (None, None) when its
    run may not advance since. Materializations of older versions carry only
    `oai/response_date` and no scope."""
    if _flag(meta, ADVANCES_SINCE_KEY) is False:
        return None, None
    value = _text(meta, NEXT_SINCE_KEY) or _text(meta, RESPONSE_DATE_KEY)
    return incremental.readable(value), _text(meta, SCOPE_KEY)


def published_state(
    instance: dg.DagsterInstance, raw_key: dg.AssetKey
) -> tuple[SinceState | None, int]:
    """The newest since observation of `raw_key` and its storage id (0 without one)."""
    for record in instance.fetch_observations(raw_key, limit=5).records:
        state = observation_state(record)
        if state is not None:
            return state, record.storage_id
    return None, 0


def published_states(
    instance: dg.DagsterInstance, raw_keys: Sequence[dg.AssetKey]
) -> dict[dg.AssetKey, tuple[SinceState | None, int]]:
    """`published_state` of many harvesters: their newest observations read at once,
    and per key only where the newest one publishes no since."""
    newest = asset_events.newest_events(instance, dg.DagsterEventType.ASSET_OBSERVATION,
                                        raw_keys, limit=1)
    out = {}
    for key, records in newest.items():
        state = observation_state(records[0]) if records else None
        if records and state is None:
            out[key] = published_state(instance, key)
        else:
            out[key] = (state, records[0].storage_id if records else 0)
    return out


_Recorded = list[tuple[Any, str, str | None]]  # (materialization record, since, scope)


def _recorded(records: Sequence[dg.EventLogRecord]) -> _Recorded:
    """The materializations (newest first) that record a since, oldest first."""
    recorded = []
    for record in reversed(records):
        mat = record.asset_materialization
        value, scope = run_since(mat.metadata) if mat is not None else (None, None)
        if value is not None:
            recorded.append((record, value, scope))
    return recorded


def _fold(state: SinceState | None, recorded: _Recorded, runs: dict[str, Any]
          ) -> SinceState | None:
    """`state` advanced by the recorded sinces of successful runs, in order."""
    for record, value, scope in recorded:
        run = runs.get(record.run_id)
        if run is None or run.dagster_run.status != dg.DagsterRunStatus.SUCCESS:
            continue
        started = run.start_time or run.create_timestamp.timestamp()
        state = incremental.after_run(state, value, scope, started, record.timestamp,
                                      f"run {record.run_id[:8]}") or state
    return state


def current_states(
    instance: dg.DagsterInstance, raw_keys: Sequence[dg.AssetKey],
) -> dict[dg.AssetKey, SinceState | None]:
    """`current_state` of many harvesters, read at once: their published sinces, the
    materializations after them (only the keys that have some are read) and those
    materializations' runs."""
    keys = list(dict.fromkeys(raw_keys))
    published = published_states(instance, keys)
    newer = asset_events.newest_events(
        instance, dg.DagsterEventType.ASSET_MATERIALIZATION, keys, _MATERIALIZATIONS,
        after={key: published[key][1] for key in keys})
    recorded = {key: _recorded(records) for key, records in newer.items()}
    runs = asset_events.run_records(instance, [record.run_id for found in recorded.values()
                                               for record, _, _ in found])
    return {key: _fold(published[key][0], recorded[key], runs) for key in keys}


def current_state(instance: dg.DagsterInstance, raw_key: dg.AssetKey) -> SinceState | None:
    """The published since plus what successful runs recorded after it (only the
    materializations after the published one are read, their runs in one query)."""
    return current_states(instance, [raw_key])[raw_key]


class _Unread(Enum):
    UNREAD = auto()


def resolve_since(
    instance: dg.DagsterInstance, h: Harvester, *, since: str | None, full: bool,
    raw_key: dg.AssetKey, state: SinceState | None | _Unread = _Unread.UNREAD,
) -> ResolvedSince:
    """The one since-resolution rule (see the module docstring); `state` is the
    harvester's `current_state` when the caller has already read it."""
    if state is _Unread.UNREAD:
        state = current_state(instance, raw_key)
    scope = incremental.scope(h.base_url, h.metadata_prefix, h.sets)
    stored, note = incremental.in_force(state, scope)
    if since:
        return ResolvedSince(since, SinceSource.RUN_CONFIG, stored=stored, note=note)
    if full:
        return ResolvedSince(None, SinceSource.FULL, stored=stored)
    if stored:
        kind = (SinceSource.OPERATOR if state is not None and state.operator
                else SinceSource.RUN)
        return ResolvedSince(stored, kind, overlap=kind is SinceSource.RUN, stored=stored,
                             origin=state.source if state is not None else "")
    if note:
        return ResolvedSince(None, SinceSource.SCOPE_CHANGED, note=note)
    return ResolvedSince(None, SinceSource.NONE)


def run_mode(instance: dg.DagsterInstance, h: Harvester, raw_key: dg.AssetKey, *,
             since: str | None = None, full: bool = False) -> str:
    """The `oaipmh/mode` tag of a harvest asked with `since` and `full` (run config):
    `full` when it is asked or no since is in force for the harvester's selection, else
    `incremental`. The schedule tags its runs with it at tick time, the op (for runs
    launched without it) when it starts."""
    resolved = resolve_since(instance, h, since=since, full=full, raw_key=raw_key)
    return MODE_INCREMENTAL if resolved.value else MODE_FULL


def since_observation(
    raw_key: dg.AssetKey, value: str | None, scope: str | None, source: str, *,
    operator: bool,
) -> dg.AssetObservation:
    """The observation that publishes a harvester's since (empty value: full next)."""
    return dg.AssetObservation(
        asset_key=raw_key,
        description=(f"since {value}" if value else "no since: the next harvest is full")
        + f" ({source})",
        metadata={SINCE_KEY: value or "", SCOPE_KEY: scope or "", SINCE_SOURCE_KEY: source,
                  OPERATOR_KEY: operator},
    )


def set_since(
    instance: dg.DagsterInstance, h: Harvester, raw_key: dg.AssetKey, value: str | None,
    source: str = "operator",
) -> None:
    """Record an operator's since (None: the next harvest is full) for the harvester's
    current selection; runs that started before it do not move it."""
    scope = incremental.scope(h.base_url, h.metadata_prefix, h.sets)
    instance.report_runless_asset_event(
        since_observation(raw_key, value, scope, source, operator=True)
    )


def parse_cursor(cursor: str | None) -> tuple[dict[str, Any], list[str]]:
    """The since sensor's cursor as a dict, and the problems found in it.

    The shape is {"since": {id: datestamp}, "published": {...}, "watermark": ..., "seen":
    [...]}. An operator may also type {"since": {id: datestamp}} alone, or a bare mapping
    {id: datestamp}: each entry is an edit, and it comes back with `"watermark": "now"`
    (a cursor of an older version has a watermark and no `published`). A cursor that is not a JSON
    object is reported and replaced by an empty one (the since in force is kept in the
    asset observations, so nothing is lost)."""
    empty: dict[str, Any] = {"since": {}, "watermark": None}
    if not cursor:
        return empty, []
    try:
        data = json.loads(cursor)
    except json.JSONDecodeError as exc:
        return {"since": {}, "watermark": "now"}, [f"the cursor is not JSON ({exc}): ignored"]
    if not isinstance(data, dict):
        return {"since": {}, "watermark": "now"}, ["the cursor is not a JSON object: ignored"]
    problems = []
    if "since" not in data:
        data = {"since": data, "watermark": "now"}
    elif "watermark" not in data and "published" not in data:  # {"since": {id: date}}
        data["watermark"] = "now"
    if not isinstance(data.get("since"), dict):
        problems.append(f"'since' must map harvester ids to dates, not {data.get('since')!r}")
        data["since"] = {}
    data.setdefault("watermark", None)
    if data["watermark"] not in (None, "now"):
        try:
            parse_user_datetime(str(data["watermark"]))
        except ValueError:
            problems.append(f"unreadable watermark {data['watermark']!r}: processing runs "
                            "from now on")
            data["watermark"] = "now"
    if not isinstance(data.get("seen", []), list):
        data["seen"] = []
    if not isinstance(data.get("published", {}), dict):
        data.pop("published")
    return data, problems


def since_report(instance: dg.DagsterInstance, h: Harvester, raw_key: dg.AssetKey
                 ) -> dict[str, Any]:
    """What the next run of `h` would use as since, where it came from, and the last
    successful harvest (for `since show` and `harvester show`)."""
    from datetime import UTC, datetime

    state = current_state(instance, raw_key)
    resolved = resolve_since(instance, h, since=None, full=False, raw_key=raw_key, state=state)
    last = None
    records = instance.fetch_materializations(raw_key, limit=_MATERIALIZATIONS).records
    runs = asset_events.run_records(instance, [record.run_id for record in records])
    for record in records:
        run = runs.get(record.run_id)
        if run is not None and run.dagster_run.status == dg.DagsterRunStatus.SUCCESS:
            last = {"run_id": record.run_id,
                    "at": datetime.fromtimestamp(record.timestamp, UTC).strftime(
                        "%Y-%m-%dT%H:%M:%SZ")}
            break
    check = (incremental.check_since(resolved.value, resolved.label() or "since",
                                     now=datetime.now(UTC)) if resolved.value else None)
    if resolved.value is None:
        next_run = "full harvest" + (f" ({resolved.note})" if resolved.note else "")
    elif check is not None and check.verdict == "ahead":
        next_run = f"full harvest ({check.message})"
    elif resolved.overlap:
        overlap = ("the default overlap" if h.overlap is None
                   else f"an overlap of {h.overlap} s")
        next_run = f"incremental from {resolved.value}, asked with {overlap}"
    else:
        next_run = f"incremental from {resolved.value} exactly"
    return {
        "since": resolved.value,
        "source": resolved.source,
        "recorded_by": state.source if state is not None else None,
        "next_run": next_run,
        "last_success": last,
    }
