"""`oaipmh_since_sensor`: publishes, per harvester of its code location, the since of
its last successful harvest. Its JSON cursor mirrors those dates (the contract: id ->
datestamp) and is where an operator may edit them in the UI; each change is published
as an observation of the harvester's `raw_records` asset, which runs read."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from oaipmh_dagster.contracts import (
    ASSET_JOB_PREFIX,
    HARVESTER_TAG,
    JOB_PREFIX,
    RAW_RECORDS,
    harvester_of,
)
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.defs.since import (
    SENSOR_NAME,
    current_states,
    parse_cursor,
    published_states,
    run_since,
    since_observation,
)
from oaipmh_dagster.harvesting import incremental
from oaipmh_dagster.harvesting.incremental import SinceState
from oaipmh_dagster.storage.registry import Harvester

MAX_RUNS_PER_TICK = 500
# Dagster stores the whole cursor in every tick row: one tick a minute by default.
SENSOR_INTERVAL_SECONDS = 60
# Seconds between ticks: Dagster's sensor daemon looks at its sensors every 5 s at most.
SENSOR_INTERVAL_ENV = "OAIPMH_SINCE_SENSOR_INTERVAL"
SENSOR_INTERVAL_BOUNDS = (5, 3600)
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
    """The tick's view of each harvester's published since (read once, then updated;
    `load` reads many at once)."""

    def __init__(self, instance: dg.DagsterInstance, harvesters: dict[str, Harvester]):
        self.instance = instance
        self.harvesters = harvesters
        self.states: dict[str, SinceState | None] = {}
        self.events: list[dg.AssetObservation] = []

    def load(self, hids: Sequence[str]) -> None:
        """Read the published sinces of those of `hids` not read yet, at once."""
        keys = {asset_keys(hid)[1]: hid for hid in dict.fromkeys(hids)
                if hid not in self.states}
        for key, (state, _) in published_states(self.instance, list(keys)).items():
            self.states[keys[key]] = state

    def get(self, hid: str) -> SinceState | None:
        if hid not in self.states:
            self.load([hid])
        return self.states[hid]

    def publish(self, hid: str, state: SinceState) -> None:
        self.states[hid] = state
        self.events.append(since_observation(asset_keys(hid)[1], state.value, state.scope,
                                             state.source, operator=state.operator))

    def scope(self, hid: str) -> str:
        h = self.harvesters[hid]
        return incremental.scope(h.base_url, h.metadata_prefix, h.sets)


# Sources of a since that this sensor publishes (the cursor it writes shows them); any
# other source (`since set`, a removed harvester) may be newer than the cursor.
_OWN_SOURCES = ("run ", "operator (cursor edit", "cursor (adopted)")


@dataclass
class Cursor:
    """The since sensor's cursor, decoded. Only `since` grows with the harvesters (about
    one entry of `"id":"datestamp",` each); the rest is a few dozen bytes."""

    since: dict[str, Any]
    watermark: str | None = None  # update time of the newest run processed ("now": none)
    seen: list[str] = field(default_factory=list)  # run ids processed at the watermark
    refresh: int = 0  # where the round robin of `_refresh` resumes
    at: float | None = None  # when the sensor wrote it (epoch seconds)
    # What the entries are compared with to find an operator's edits: a legacy cursor's
    # `published` map, {} for an operator's bare mapping (its entries are the edits),
    # None for the published sinces (read only when `edited`).
    baseline: dict[str, Any] | None = None
    edited: bool = False
    fill: bool = False  # entries of harvesters missing from `since` come from the instance
    adopt: bool = False  # a cursor of the first version: its entries become published


def _digest(since: dict[str, Any]) -> str:
    text = json.dumps(since, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def encode_cursor(cursor: Cursor) -> str:
    """The compact JSON the sensor stores: `since` (the contract: id -> datestamp), the
    watermark, the runs seen at it, the refresh offset, the time it was written and a
    digest of `since` that tells an operator's edit from the sensor's own writing."""
    since = dict(sorted(cursor.since.items()))
    return json.dumps({"since": since, "watermark": cursor.watermark, "seen": cursor.seen,
                       "refresh": cursor.refresh, "at": round(cursor.at or 0, 3),
                       "digest": _digest(since)}, separators=(",", ":"))


def decode_cursor(text: str | None) -> tuple[Cursor, list[str]]:
    """The stored cursor (any version, or an operator's edit) and its problems. Empty:
    the watermark starts now, and the entries come from the published sinces (a run
    before now that the sensor never published is still read by since resolution)."""
    if not text:
        return Cursor({}, "now", fill=True), []
    data, problems = parse_cursor(text)
    seen = [x for x in data.get("seen") or [] if isinstance(x, str)]
    refresh = data.get("refresh")
    cur = Cursor(dict(data["since"]), data.get("watermark"), seen,
                 refresh if isinstance(refresh, int) else 0)
    if isinstance(data.get("published"), dict):  # written by an earlier version
        cur.baseline, cur.edited = dict(data["published"]), True
    elif "digest" in data:
        at = data.get("at")
        cur.at = float(at) if isinstance(at, int | float) else None
        cur.edited = data["digest"] != _digest(cur.since)
    elif cur.watermark == "now":  # an operator's mapping, or an unreadable cursor
        cur.baseline, cur.edited, cur.fill = {}, True, True
    else:  # the first version: since and watermark only
        cur.adopt = True
    return cur, problems


def evaluate(
    instance: dg.DagsterInstance, cursor: str | None, harvesters: Sequence[Harvester],
    location_name: str | None = None, now: datetime | None = None,
) -> Tick:
    """One tick: the operator's cursor edits, then successful runs since the watermark."""
    now = now or datetime.now(UTC)
    cur, problems = decode_cursor(cursor)
    lines = [f"cursor problem: {p}" for p in problems]
    by_id = {h.id: h for h in harvesters}
    view = _Since(instance, by_id)
    since = {hid: v for hid, v in cur.since.items() if hid in by_id}
    if cur.adopt:
        _adopt(view, since, now)
    elif cur.edited:
        _apply_edits(view, cur, since, now, lines)
    if cur.fill:
        _fill(view, since)
    if cur.watermark == "now":
        cur.watermark = now.isoformat()
    watermark, seen = _advance(instance, cur, view, since, location_name, lines)
    refresh = _refresh(view, since, cur.refresh)
    new = Cursor(since, watermark, seen, refresh, now.timestamp())
    return Tick(encode_cursor(new), view.events, lines)


def _adopt(view: _Since, since: dict[str, Any], now: datetime) -> None:
    """Publish a first-version cursor's entries where nothing is published yet."""
    view.load(list(since))
    for hid, value in list(since.items()):
        if (incremental.readable(value) and view.get(hid) is None
                and incremental.check_since(value, "cursor", now=now).verdict == "ok"):
            view.publish(hid, SinceState(value, view.scope(hid), False, now.timestamp(),
                                         "cursor (adopted)"))


def _baseline(view: _Since, cur: Cursor, hid: str) -> tuple[Any, bool]:
    """What `hid`'s entry is compared with, and whether that value is newer than the
    cursor the operator edited (then a differing entry is stale, not an edit)."""
    if cur.baseline is not None:
        return cur.baseline.get(hid), False
    state = view.get(hid)
    if state is None:
        return None, False
    newer = (cur.at is not None and state.at > cur.at
             and not state.source.startswith(_OWN_SOURCES))
    return state.value, newer


def _apply_edits(view: _Since, cur: Cursor, since: dict[str, Any], now: datetime,
                 lines: list[str]) -> None:
    """Publish each entry an operator changed (a removed entry: a full harvest next)."""
    ids = set(view.harvesters) if cur.baseline is None else set(since) | set(cur.baseline)
    if cur.baseline is None:
        view.load(sorted(ids))
    for hid in sorted(ids & set(view.harvesters)):
        value, (was, newer) = since.get(hid), _baseline(view, cur, hid)
        if value == was or (value is None and was in (None, "")):
            continue
        if newer:
            lines.append(f"{hid}: kept the since {was} set after the edited cursor was "
                         "written (its entry there was older)")
            _put(since, hid, was)
        elif value in (None, ""):
            view.publish(hid, SinceState(None, view.scope(hid), True, now.timestamp(),
                                         "operator (cursor edit: reset)"))
            lines.append(f"{hid}: since reset by a cursor edit: the next harvest is full")
            since.pop(hid, None)
        elif (why := _refused(hid, value, now)) is None:
            view.publish(hid, SinceState(value, view.scope(hid), True, now.timestamp(),
                                         "operator (cursor edit)"))
            lines.append(f"{hid}: since set to {value} by a cursor edit")
        else:
            lines.append(f"{hid}: ignored the cursor's value: {why}")
            _put(since, hid, was)


def _refused(hid: str, value: Any, now: datetime) -> str | None:
    """Why an operator's cursor entry is not taken as a since (None: it is): not a
    datestamp, or refused by the one rule (`incremental.check_since`)."""
    if not incremental.readable(value):
        return f"{value!r} is not a datestamp (YYYY-MM-DD or YYYY-MM-DDThh:mm:ssZ)"
    check = incremental.check_since(value, f"cursor edit of {hid}", now=now)
    return None if check.verdict == "ok" else check.message


def _put(since: dict[str, Any], hid: str, value: Any) -> None:
    if value in (None, ""):
        since.pop(hid, None)
    else:
        since[hid] = value


def _fill(view: _Since, since: dict[str, Any]) -> None:
    """Entries for the harvesters the cursor lacks: their since in force, published
    where successful runs recorded one the sensor has not published yet."""
    missing = [hid for hid in sorted(view.harvesters) if hid not in since]
    view.load(missing)
    keys = {asset_keys(hid)[1]: hid for hid in missing}
    for key, state in current_states(view.instance, list(keys)).items():
        hid = keys[key]
        published = view.get(hid)
        if state is not None and state != published:
            view.publish(hid, state)
        if state is not None and state.value:
            since[hid] = state.value


def _advance(
    instance: dg.DagsterInstance, cur: Cursor, view: _Since, since: dict,
    location_name: str | None, lines: list[str],
) -> tuple[str | None, list[str]]:
    """Publish the since of successful runs finished after the watermark."""
    watermark = cur.watermark
    seen = list(cur.seen)
    after = datetime.fromisoformat(watermark) if watermark else None
    records = instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS], updated_after=after),
        limit=MAX_RUNS_PER_TICK, order_by="update_timestamp", ascending=True,
    )
    view.load([hid for rec in records
               if (hid := rec.dagster_run.tags.get(HARVESTER_TAG)) in view.harvesters])
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
        _publish_run(instance, rec, view, since, lines)
    return (after.isoformat() if after else watermark), seen


def _publish_run(instance: dg.DagsterInstance, rec: Any, view: _Since, since: dict,
                 lines: list[str]) -> None:
    """Publish the since a successful run's raw_records materializations recorded."""
    run = rec.dagster_run
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
        since[hid] = value


def _refresh(view: _Since, since: dict, offset: int) -> int:
    """Mirror the published since of a slice of harvesters into the cursor."""
    ids = sorted(view.harvesters)
    if not ids:
        return 0
    offset %= len(ids)
    chosen = (ids[offset:] + ids[:offset])[:REFRESH_PER_TICK]
    view.load(chosen)
    for hid in chosen:
        if any(e.asset_key.path[1] == hid for e in view.events):
            continue
        state = view.get(hid)
        if state is None:
            continue
        _put(since, hid, state.value)
    return (offset + REFRESH_PER_TICK) % len(ids)


def report(instance: dg.DagsterInstance, tick: Tick) -> None:
    """Report a tick's observations as the sensor daemon does (tests, tools)."""
    for event in tick.events:
        instance.report_runless_asset_event(event)


def sensor_interval(environ: Mapping[str, str] | None = None) -> int:
    """Seconds between the since sensor's ticks: `$OAIPMH_SINCE_SENSOR_INTERVAL`, default
    60; ValueError (one line) when it is not a whole number in the bounds."""
    raw = (os.environ if environ is None else environ).get(SENSOR_INTERVAL_ENV, "").strip()
    if not raw:
        return SENSOR_INTERVAL_SECONDS
    low, high = SENSOR_INTERVAL_BOUNDS
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ValueError(f"${SENSOR_INTERVAL_ENV} must be a whole number of seconds in "
                         f"[{low}, {high}], not {raw!r}")
    return int(raw)


def build_since_sensor(
    harvesters: Sequence[Harvester], location_name: str | None = None
) -> dg.SensorDefinition:
    """The plain `@dg.sensor` that owns its cursor (run_status_sensor would own it)."""
    rows = list(harvesters)

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=sensor_interval(),
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
        # The daemon writes back the cursor a tick returns: an edit stored while this
        # tick runs is overwritten (docs/since.md says so).
        tick = evaluate(context.instance, context.cursor, rows, location_name)
        for line in tick.lines:
            context.log.info(line)
        changes = [line for line in tick.lines if "since" in line]
        return dg.SensorResult(
            cursor=tick.cursor, asset_events=tick.events,
            skip_reason="; ".join(changes) if changes else "no newly successful harvest runs",
        )

    return oaipmh_since_sensor
