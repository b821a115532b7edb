"""A Dagster instance and a registry of N harvesters in the shapes `harvester list` and
since resolution meet, written fast (case 13).

Each harvester gets the runs and `raw_records` events of one of these histories, by its
index (`SHAPES`, in turn): never harvested; a since set by an operator and nothing else;
two successful runs, both published by the since sensor; a successful run not published
yet (the sensor has not ticked since); a published success then a failed run; a
published success then an operator's later since; a since published for another
selection (URL, prefix or sets changed since); two successful runs and a partial one,
none published. A successful run plans and materializes `raw_records` and `records` as a
harvest does (its `raw_records` metadata records a since and its scope); a published
since is a runless observation as the sensor reports it; a failed run plans its assets.

Writing each event through the instance costs two SQLite connections, a schema
inspection and a commit, and serializing it about 1 ms (10,000 harvesters have about
45,000 events and 11,000 runs). So the fill writes the rows that `add_run` and
`store_event` write, in one transaction per table, each run and event rendered from one
serialized template per kind (`_Templates`: the serialized text of the same object with
placeholder values, the placeholders then replaced); the first harvester of each shape
is checked against the objects serialized by Dagster itself. On SQLite the events go to
the index database only (where every asset query reads them): the per-run shards, read
only by a run's own event log, stay empty."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

SHAPES = ("never", "operator", "published", "unpublished", "failed_after",
          "operator_after", "other_scope", "partial")
DAY = 86400.0
RUNLESS_JOB = "__RUNLESS__"


def harvesters(n: int) -> list[Any]:
    """N harvesters, about a third of them with sets, all with a daily cron."""
    from oaipmh_dagster.storage.registry import Harvester

    sets = ("publications", "datasets", "theses")
    return [Harvester(id=f"list_{i:05d}", base_url=f"http://127.0.0.1:9/oai{i % 37}",
                      metadata_prefix="oai_dc", sets=sets[: i % 3],
                      cron=f"{i % 60} {i % 24} * * *") for i in range(n)]


def fill_registry(url: str, rows: list[Any]) -> None:
    """The registry rows, in one transaction (`Registry.add` commits each)."""
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import harvester_table

    now = datetime.now(UTC)
    values = []
    for h in rows:
        row = dataclasses.asdict(dataclasses.replace(h, created=now, updated=now))
        row["sets"] = list(h.sets)
        values.append(row)
    with db.get_engine(url).begin() as conn:
        conn.execute(harvester_table.insert(), values)


@dataclasses.dataclass(frozen=True)
class Event:
    """One asset event of a harvester (`kind`: planned, materialized or observed)."""

    kind: str
    hid: str
    asset: str  # raw_records | records
    run_id: str
    at: float
    since: str = ""
    scope: str = ""
    source: str = ""
    flag: bool = True  # materialized: advances since; observed: set by an operator


@dataclasses.dataclass(frozen=True)
class Run:
    hid: str
    host: str
    run_id: str
    status: str
    created: float
    ended: float


def build_event(e: Event) -> Any:
    """The EventLogEntry of `e`, as Dagster writes it."""
    import dagster as dg
    from dagster._core.events import (
        AssetMaterializationPlannedData,
        AssetObservationData,
        DagsterEvent,
        DagsterEventType,
        StepMaterializationData,
    )
    from dagster._core.events.log import EventLogEntry

    from oaipmh_dagster.defs.since import since_observation

    key = dg.AssetKey(["oaipmh", e.hid, e.asset])
    job = RUNLESS_JOB if e.kind == "observed" else f"harvest_oaipmh_records_{e.hid}"
    if e.kind == "planned":
        kind, data = (DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
                      AssetMaterializationPlannedData(key))
    elif e.kind == "observed":
        obs = since_observation(key, e.since, e.scope, e.source, operator=e.flag)
        kind, data = DagsterEventType.ASSET_OBSERVATION, AssetObservationData(obs)
    else:
        meta = (_raw_meta(e.since, e.scope, e.flag) if e.asset == "raw_records"
                else {"records": 120})
        kind = DagsterEventType.ASSET_MATERIALIZATION
        data = StepMaterializationData(dg.AssetMaterialization(key, metadata=meta))
    return EventLogEntry(user_message="", level=20, job_name=job, run_id=e.run_id,
                         error_info=None, timestamp=e.at, step_key=None,
                         dagster_event=DagsterEvent(event_type_value=kind.value,
                                                    job_name=job, event_specific_data=data))


def build_run(r: Run) -> Any:
    import dagster as dg

    from oaipmh_dagster.contracts import HARVESTER_TAG, HOST_TAG, MODE_TAG

    return dg.DagsterRun(job_name=f"harvest_oaipmh_records_{r.hid}", run_id=r.run_id,
                         tags={HARVESTER_TAG: r.hid, HOST_TAG: r.host, MODE_TAG: "incremental"},
                         status=dg.DagsterRunStatus(r.status))


def _raw_meta(since: str, scope: str, advances: bool) -> dict[str, Any]:
    """The shape of a harvest's raw_records metadata (`assets.raw_metadata`)."""
    from oaipmh_dagster.contracts import (
        ADVANCES_SINCE_KEY,
        NEXT_SINCE_KEY,
        RESPONSE_DATE_KEY,
        SCOPE_KEY,
        SINCE_KEY,
        SINCE_NOTE_KEY,
        SINCE_SOURCE_KEY,
    )

    return {RESPONSE_DATE_KEY: since, NEXT_SINCE_KEY: since, ADVANCES_SINCE_KEY: advances,
            SCOPE_KEY: scope, SINCE_NOTE_KEY: "", "oai/mode": "incremental", SINCE_KEY: "",
            SINCE_SOURCE_KEY: "run", "oai/until": "", "oai/granularity": "YYYY-MM-DDThh:mm:ssZ",
            "oai/sets": "(all)", "records": 120, "new": 3, "updated": 2, "deleted": 0,
            "unchanged": 115, "failed": 0, "pages": 2, "requests": 3, "retries": 0,
            "bytes": 48213, "duration_s": 1.234, "records_per_second": 97.2,
            "oai/reconcile": False}


class Templates:
    """Serialized runs, events and materialization records, rendered from the text of the
    same object built with placeholder values."""

    TOKENS = {"hid": "zzhidzz", "run_id": "zzrunzz", "since": "zzsincezz",
              "scope": "zzscopezz", "source": "zzsourcezz", "host": "zzhostzz"}
    AT, STORAGE_ID = 4102444800.25, 987654321

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], str] = {}

    def _template(self, key: tuple[Any, ...], build: Any) -> str:
        if key not in self._cache:
            from dagster._serdes import serialize_value

            self._cache[key] = serialize_value(build())
        return self._cache[key]

    def _render(self, text: str, obj: Any, numbers: dict[str, str] | None = None) -> str:
        for name, token in self.TOKENS.items():
            if hasattr(obj, name):
                text = text.replace(token, json.dumps(getattr(obj, name))[1:-1])
        for token, value in (numbers or {}).items():
            text = text.replace(token, value)
        return text

    def _token_event(self, e: Event) -> Event:
        t = self.TOKENS
        return dataclasses.replace(e, hid=t["hid"], run_id=t["run_id"], at=self.AT,
                                   since=t["since"], scope=t["scope"], source=t["source"])

    def event(self, e: Event) -> str:
        key = ("event", e.kind, e.asset, e.flag)
        text = self._template(key, lambda: build_event(self._token_event(e)))
        return self._render(text, e, {repr(self.AT): repr(e.at)})

    def record(self, e: Event, storage_id: int) -> str:
        """The serialized EventLogRecord that `asset_keys.last_materialization` holds."""
        from dagster._core.storage.event_log.base import EventLogRecord

        key = ("record", e.kind, e.asset, e.flag)
        text = self._template(key, lambda: EventLogRecord(
            storage_id=self.STORAGE_ID, event_log_entry=build_event(self._token_event(e))))
        return self._render(text, e, {repr(self.AT): repr(e.at),
                                      str(self.STORAGE_ID): str(storage_id)})

    def run(self, r: Run) -> str:
        t = self.TOKENS
        text = self._template(("run", r.status), lambda: build_run(dataclasses.replace(
            r, hid=t["hid"], run_id=t["run_id"], host=t["host"])))
        return self._render(text, r)


@dataclasses.dataclass
class History:
    """The runs and events of the instance, in the order they happened."""

    runs: list[Run] = dataclasses.field(default_factory=list)
    events: list[Event] = dataclasses.field(default_factory=list)
    clock: float = 0.0

    def tick(self, seconds: float = 60.0) -> float:
        self.clock += seconds
        return self.clock

    def run(self, h: Any, status: str, since: str = "", scope: str = "",
            advances: bool = True) -> str:
        """A run of the harvester's job: planned, then (on success) materialized."""
        run_id = str(uuid.uuid4())
        created = self.tick()
        self.runs.append(Run(h.id, h.host, run_id, status, created, created + 120))
        for asset in ("raw_records", "records"):
            self.events.append(Event("planned", h.id, asset, run_id, created))
        if status == "SUCCESS":
            self.events.append(Event("materialized", h.id, "raw_records", run_id,
                                     created + 100, since, scope, flag=advances))
            self.events.append(Event("materialized", h.id, "records", run_id, created + 110))
        self.tick(200)
        return run_id

    def publish(self, h: Any, since: str, scope: str, source: str, operator: bool) -> None:
        """A since observation, as the sensor (or `since set`) reports it."""
        self.events.append(Event("observed", h.id, "raw_records", "", self.tick(), since,
                                 scope, source, flag=operator))


def _since(day: int, i: int) -> str:
    stamp = datetime.fromtimestamp(1_780_000_000 + day * DAY + i, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def _one(hist: History, h: Any, i: int, shape: str) -> None:
    from oaipmh_dagster.harvesting import incremental

    scope = incremental.scope(h.base_url, h.metadata_prefix, h.sets)
    if shape == "never":
        return
    if shape in ("operator", "other_scope"):
        other = shape == "other_scope"
        hist.publish(h, _since(1, i), scope + ("|before" if other else ""),
                     "run 00000000" if other else "operator", operator=not other)
        return
    first = hist.run(h, "SUCCESS", _since(1, i), scope)
    if shape == "unpublished":
        return
    if shape == "partial":
        hist.run(h, "SUCCESS", _since(2, i), scope)
        hist.run(h, "SUCCESS", _since(3, i), scope, advances=False)
        return
    hist.publish(h, _since(1, i), scope, f"run {first[:8]}", operator=False)
    if shape == "published":
        second = hist.run(h, "SUCCESS", _since(2, i), scope)
        hist.publish(h, _since(2, i), scope, f"run {second[:8]}", operator=False)
    elif shape == "failed_after":
        hist.run(h, "FAILURE")
    elif shape == "operator_after":
        hist.publish(h, _since(4, i), scope, "operator", operator=True)


def history(rows: list[Any], start: float) -> History:
    """Every harvester's runs and events (harvester i takes shape i mod len(SHAPES))."""
    out = History(clock=start)
    for i, h in enumerate(rows):
        _one(out, h, i, SHAPES[i % len(SHAPES)])
    return out


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _naive(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC).replace(tzinfo=None)


def write_runs(instance: Any, runs: list[Run], templates: Templates) -> None:
    """The rows `add_run` writes (runs, run_tags), with the start and end times a run's
    start and end events set, in one transaction."""
    from dagster._core.storage.runs.schema import RunsTable, RunTagsTable

    from oaipmh_dagster.contracts import HARVESTER_TAG, HOST_TAG, MODE_TAG

    storage = instance.run_storage
    stats, backfill = storage.has_run_stats_index_cols(), storage.has_backfill_id_column()
    with storage.connect() as conn:
        for chunk in _chunks(runs, 500):
            values, tags = [], []
            for r in chunk:
                row = {"run_id": r.run_id, "pipeline_name": f"harvest_oaipmh_records_{r.hid}",
                       "status": r.status, "run_body": templates.run(r), "snapshot_id": None,
                       "partition": None, "partition_set": None,
                       "create_timestamp": _naive(r.created), "update_timestamp": _naive(r.ended)}
                if backfill:
                    row["backfill_id"] = None
                if stats:
                    row.update(start_time=r.created + 1, end_time=r.ended)
                values.append(row)
                tags.extend({"run_id": r.run_id, "key": k, "value": v} for k, v in
                            {HARVESTER_TAG: r.hid, HOST_TAG: r.host,
                             MODE_TAG: "incremental"}.items())
            conn.execute(RunsTable.insert(), values)
            conn.execute(RunTagsTable.insert(), tags)


def _asset_key(hid: str, asset: str) -> str:
    return json.dumps(["oaipmh", hid, asset])


def write_events(instance: Any, events: list[Event], templates: Templates) -> None:
    """The rows `store_event` writes for asset events (the event; the asset key's entry:
    its last materialization record, last run id and last event time), in one
    transaction of the index storage. Storage ids follow the table's current maximum."""
    import sqlalchemy as sa
    from dagster._core.storage.event_log.schema import AssetKeyTable, SqlEventLogStorageTable

    storage = instance.event_log_storage
    table = SqlEventLogStorageTable
    with storage.index_transaction() as conn:
        first = (conn.execute(sa.select(sa.func.max(table.c.id))).scalar() or 0) + 1
        entries: dict[str, dict[str, Any]] = {}
        for chunk_start in range(0, len(events), 1000):
            chunk = events[chunk_start:chunk_start + 1000]
            conn.execute(table.insert(), [
                {"run_id": e.run_id, "event": templates.event(e),
                 "dagster_event_type": _TYPES[e.kind], "timestamp": _naive(e.at),
                 "step_key": None, "asset_key": _asset_key(e.hid, e.asset), "partition": None}
                for e in chunk])
            for offset, e in enumerate(chunk):
                entry = entries.setdefault(_asset_key(e.hid, e.asset), {
                    "last_materialization": None, "last_run_id": None})
                entry["last_materialization_timestamp"] = _naive(e.at)
                if e.kind == "materialized":
                    entry["last_materialization"] = templates.record(
                        e, first + chunk_start + offset)
                if e.kind != "observed":
                    entry["last_run_id"] = e.run_id
        last = conn.execute(sa.select(sa.func.max(table.c.id))).scalar()
        if last != first + len(events) - 1:
            raise RuntimeError(f"storage ids {first}..{last} for {len(events)} events")
        conn.execute(AssetKeyTable.insert(), [{"asset_key": key, **values}
                                              for key, values in entries.items()])
    if conn.dialect.name == "postgresql":  # the statistics autovacuum gathers soon after
        with storage.index_connection() as conn:
            conn.execute(sa.text("ANALYZE"))


_TYPES = {"planned": "ASSET_MATERIALIZATION_PLANNED", "materialized": "ASSET_MATERIALIZATION",
          "observed": "ASSET_OBSERVATION"}


def check_templates(built: History, templates: Templates, rows: list[Any]) -> int:
    """Each event and run of the first harvester of every shape, rendered, deserializes to
    the object Dagster builds (how many were checked)."""
    from dagster._core.storage.event_log.base import EventLogRecord
    from dagster._serdes import deserialize_value

    sample = {h.id for h in rows[:len(SHAPES)]}
    checked = 0
    for e in (e for e in built.events if e.hid in sample):
        assert deserialize_value(templates.event(e)) == build_event(e), e
        if e.kind == "materialized":
            assert deserialize_value(templates.record(e, 42)) == EventLogRecord(
                storage_id=42, event_log_entry=build_event(e)), e
        checked += 1
    for r in (r for r in built.runs if r.hid in sample):
        assert deserialize_value(templates.run(r)) == build_run(r), r
        checked += 1
    return checked


def fill(instance: Any, registry_url: str, n: int) -> dict[str, Any]:
    """N harvesters in the registry at `registry_url`, their histories in `instance`."""
    t0 = time.perf_counter()
    rows = harvesters(n)
    fill_registry(registry_url, rows)
    built = history(rows, time.time() - 30 * DAY)
    templates = Templates()
    checked = check_templates(built, templates, rows)
    write_runs(instance, built.runs, templates)
    write_events(instance, built.events, templates)
    return {"n": n, "runs": len(built.runs), "events": len(built.events),
            "checked": checked, "seconds": time.perf_counter() - t0}
