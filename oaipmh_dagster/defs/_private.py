"""Every use of Dagster's private API, in one place. Written for the dagster 1.13
series (`SUPPORTED_SERIES`; checked on 1.13.27): oaipmh_dagster_tests/defs/test_private.py
asserts that the installed dagster is of that series and exercises each function here, so
an upgrade fails there first, loudly.

The harvesters' op and job are built through the public API (an `@dg.op` per harvester
with its name and pool, tied to its assets by the `AssetsDefinition` constructor with
`can_subset`; `dg.define_asset_job` resolved against a `Definitions` of the harvester's
own assets). The private builders they replaced (one op definition copied under each
harvester's name, `build_asset_job` over an `AssetGraph` of the harvester's assets) are
kept as the baseline of benchmarks case 12: a location of 200 harvesters (a shard) took
3.08 s of CPU to load through the public ones against 2.31 s (+0.76 s), one of 1,000
20.7 s against 13.9 s (measured on 2026-12-02 at a load average of 15 to 30).

Why each remaining use stays private, and the public fallback:

- `LoadContext`: the harvester rows handed to run workers in the load context's pending
  reconstruction metadata (`Definitions.with_reconstruction_metadata` alone does not
  reach them), read back on reconstruction, and the code location's name.
  `dg.StateBackedComponent` is the public home for "definitions built from external
  state", and its code-server mode behaves like this (state refreshed on every code
  location load, shipped to run workers). It is not used: it is a component, built
  through a component tree and a project root (a `defs/` folder layout, not the
  `oaipmh_dagster.definitions` module that workspace.yaml names), it reads its state
  back through a temporary file on each load, and the mode that behaves like ours is
  named `LEGACY_CODE_SERVER_SNAPSHOTS`. Fallback: read the registry in run workers too
  (a row removed after a load then breaks the run at load time instead of failing it
  with a clear message).
- `stop_schedule_states`: `oaipmh-dagster harvester remove` stops the harvester's
  schedule with the webserver's public GraphQL `stopRunningSchedule` when a webserver
  answers; without one it writes the instigator state itself. The public
  `dagster schedule stop` does not fit there: it starts a code server for the whole
  location, about 19 s per call measured with one harvester (most of it waiting for that
  server to shut down), more with many. Fallback: leave a started schedule of a removed
  harvester running in the instance (a harvester added again under that id would then
  start with it running).
- `stored_schedule_statuses`: `harvester list` shows each schedule's stored on/off state
  without a webserver. Fallback: GraphQL `scheduleOrError` when a webserver answers,
  else the registry's default (on when enabled with a cron).
- `stored_schedules`, `forget_schedule`: `oaipmh-dagster workspace --shards K` carries
  each schedule state that a re-shard would leave behind in a location that no longer
  holds the harvester into the registry's `enabled` (the schedule's default status in
  its new location), then deletes it. Fallback: a moved harvester's schedule returns to
  its registry default.
- `execute_in_location`: `oaipmh-dagster harvest` runs the harvester's job in process,
  its run created with the remote origin a launch from the webserver gives it (code
  location, repository, job), so the job's Runs tab (which filters by job name and the
  repository label tag that origin writes) lists it, and the UI can re-execute it.
  `execute_in_process` and `execute_job` take no origin: it is added to the run that
  `execute_in_process` creates, by wrapping that one call of the instance.
  Fallback: pass the label tag (`REPOSITORY_LABEL_TAG`, a hidden Dagster tag) as a run
  tag (listed, but no origin: no re-execution from the UI).
- `forget_defs_state_storage`: tests reset the instance Dagster remembers in a context
  variable between instances (no fallback needed outside tests).
- `newest_asset_event_ids`, `asset_event_records`, `newest_tagged_run_ids`: `harvester
  list`, the since sensor and since resolution read every harvester's newest since
  observation, newest materializations and newest run. The public API reads one asset
  key per call (`fetch_observations`, `fetch_materializations`: two statements each;
  `get_asset_records` never fills in `AssetEntry.last_observation_record` on Dagster's
  SQL storages, and deserializes a whole materialization per key) and one tag value per
  newest-run query (`get_run_records` accepts `bucket_by` and its SQL storage ignores
  it): four statements per harvester, 83 s for `harvester list` of 10,000 harvesters on
  SQLite (benchmarks case 13). These read the same tables (`event_logs`, `asset_keys`,
  `runs`, `run_tags`) with one ranked query per 2,000 keys and answer what the public
  calls answer for each key; a wiped asset is left to the public calls. Fallback
  (`defs/asset_events.py` takes it by itself for a storage that is not Dagster's SQL
  one, and for a single key): the public per-key calls.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster._core.definitions.definitions_load_context import (
    DefinitionsLoadContext,
    DefinitionsLoadType,
)
from dagster._core.definitions.metadata.metadata_value import (
    CodeLocationReconstructionMetadataValue,
)
from dagster._core.definitions.repository_definition import RepositoryLoadData
from dagster._core.definitions.repository_definition.valid_definitions import (
    SINGLETON_REPOSITORY_NAME,
)
from dagster._core.remote_origin import (
    ManagedGrpcPythonEnvCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.scheduler.instigation import InstigatorStatus, InstigatorType
from dagster._core.storage.tags import REPOSITORY_LABEL_TAG as REPOSITORY_LABEL_TAG  # re-exported
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

# The minor series this module was written for; pyproject.toml pins dagster to it.
SUPPORTED_SERIES = "1.13"
# The repository a code location's `Definitions` become, and the run tag Dagster writes
# from a run's remote origin ("<repository>@<location>": the job's Runs tab filters by it).
REPOSITORY_NAME = SINGLETON_REPOSITORY_NAME


class LoadContext:
    """What the code location load needs from Dagster's definitions load context. Dagster
    sets one when it loads a code location; a direct call (tests, scripts) has none, and
    creating one would touch global instance state."""

    def __init__(self) -> None:
        self._context = DefinitionsLoadContext.get() if DefinitionsLoadContext.is_set() else None

    @property
    def location_name(self) -> str | None:
        """The code location's name (None outside a code location load)."""
        return self._context.code_location_name if self._context is not None else None

    def reconstructed(self, key: str) -> str | None:
        """The value stored under `key` by the load this run worker is rebuilt from."""
        context = self._context
        if context is None or context.load_type != DefinitionsLoadType.RECONSTRUCTION:
            return None
        return context.reconstruction_metadata.get(key)

    def hand_to_run_workers(self, key: str, value: str) -> None:
        """Store `value` where run workers rebuild this code location from."""
        if self._context is not None:
            self._context.add_to_pending_reconstruction_metadata(key, value)


@contextmanager
def reconstruction(metadata: Mapping[str, str]) -> Iterator[None]:
    """Load definitions as a run worker does, from `metadata` (tests, tools)."""
    data = RepositoryLoadData(reconstruction_metadata={
        k: CodeLocationReconstructionMetadataValue(v) for k, v in metadata.items()})
    with DefinitionsLoadContext.scoped(
        DefinitionsLoadContext(DefinitionsLoadType.RECONSTRUCTION, data)
    ):
        yield


@contextmanager
def initialization(pending: dict[str, str]) -> Iterator[None]:
    """Load definitions as a code server does; `pending` receives what the load hands
    to run workers (tests, tools)."""
    context = DefinitionsLoadContext(DefinitionsLoadType.INITIALIZATION)
    with DefinitionsLoadContext.scoped(context):
        yield
    pending.update(context.get_pending_reconstruction_metadata())


def stored_schedule_statuses(instance: dg.DagsterInstance) -> dict[str, str]:
    """Schedule name -> "RUNNING" or "STOPPED" as the instance stores it (once started or
    stopped in the UI or by the daemon); a schedule without a stored state, or one that
    defers to its code, is absent: its default status applies. One running state (of any
    location) wins."""
    out: dict[str, str] = {}
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE):
        status = state.status
        if status in (InstigatorStatus.RUNNING, InstigatorStatus.STOPPED) \
                and out.get(state.name) != "RUNNING":
            out[state.name] = status.value
    return out


def stop_schedule_states(instance: dg.DagsterInstance, name: str) -> int:
    """Stop every running stored state of schedule `name`; how many were stopped."""
    stopped = 0
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE):
        if state.name == name and state.status == InstigatorStatus.RUNNING:
            instance.update_instigator_state(state.with_status(InstigatorStatus.STOPPED))
            stopped += 1
    return stopped


@dataclass(frozen=True)
class StoredSchedule:
    """A schedule state the instance stores (started or stopped in the UI)."""

    name: str
    location: str
    running: bool
    origin_id: str
    selector_id: str


def stored_schedules(instance: dg.DagsterInstance) -> list[StoredSchedule]:
    """Every schedule state stored as RUNNING or STOPPED, with its code location."""
    out = []
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE):
        if state.status not in (InstigatorStatus.RUNNING, InstigatorStatus.STOPPED):
            continue
        location = state.origin.repository_origin.code_location_origin.location_name
        out.append(StoredSchedule(state.name, location,
                                  state.status == InstigatorStatus.RUNNING,
                                  state.instigator_origin_id, state.selector_id))
    return out


def forget_schedule(instance: dg.DagsterInstance, stored: StoredSchedule) -> None:
    """Delete a stored schedule state: the schedule's default status applies again."""
    instance.delete_instigator_state(stored.origin_id, stored.selector_id)


def forget_defs_state_storage() -> None:
    """Forget the instance whose definitions state storage Dagster keeps in a context
    variable: a test's instance, gone since, would make the next definitions load fail
    ("undefined DagsterInstance weakref")."""
    from dagster._core.storage.defs_state.base import _current_storage

    _current_storage.set(None)


def job_origin(location_name: str, job_name: str,
               module: str = "oaipmh_dagster.definitions") -> RemoteJobOrigin:
    """The remote origin of job `job_name` of code location `location_name`, as the
    webserver gives it to a run of a `python_module` workspace entry."""
    target = LoadableTargetOrigin(executable_path=sys.executable, module_name=module,
                                  working_directory=os.getcwd())
    location = ManagedGrpcPythonEnvCodeLocationOrigin(target, location_name)
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, REPOSITORY_NAME), job_name)


def execute_in_location(job: dg.JobDefinition, location_name: str,
                        instance: dg.DagsterInstance, **kwargs: Any) -> dg.ExecuteInProcessResult:
    """`job.execute_in_process(instance=instance, **kwargs)`, its run created with the
    remote origin of `job` in code location `location_name`."""
    origin = job_origin(location_name, job.name)
    create = instance.create_run_for_job

    def create_in_location(*args: Any, **run_kwargs: Any) -> dg.DagsterRun:
        return create(*args, **{**run_kwargs, "remote_job_origin": origin})

    instance.create_run_for_job = create_in_location  # type: ignore[method-assign]
    try:
        result = job.execute_in_process(instance=instance, **kwargs)
    finally:
        del instance.create_run_for_job
    if result.dagster_run.remote_job_origin != origin:
        raise RuntimeError("execute_in_process no longer creates its run through "
                           "DagsterInstance.create_run_for_job: see _private.py")
    return result


# Keys or tag values per batched query: SQLite allows 32,766 bound parameters, and each
# statement on PostgreSQL opens a connection of its own (Dagster's storages pool none).
_PER_QUERY = 2000


def _chunks(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), _PER_QUERY):
        yield items[start:start + _PER_QUERY]


def newest_asset_event_ids(instance: dg.DagsterInstance, event_type: dg.DagsterEventType,
                           keys: Sequence[dg.AssetKey], limit: int
                           ) -> dict[dg.AssetKey, list[int]] | None:
    """The storage ids of the `limit` newest events of `event_type` of each key, newest
    first (what `fetch_observations` / `fetch_materializations(key, limit)` return),
    ranked in one query per 2,000 keys. A wiped key is left out (the public call filters
    its events by the wipe's time). None when the event log is not Dagster's SQL one."""
    import sqlalchemy as sa
    from dagster._core.storage.event_log.schema import SqlEventLogStorageTable as events
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    storage = instance.event_log_storage
    if not isinstance(storage, SqlEventLogStorage):
        return None
    out: dict[dg.AssetKey, list[int]] = {}
    for chunk in _chunks(list(keys)):
        details = storage._get_assets_details(chunk)  # noqa: SLF001
        plain = {key.to_string(): key for key, d in zip(chunk, details, strict=True)
                 if not (d and d.last_wipe_timestamp)}
        rank = sa.func.row_number().over(partition_by=events.c.asset_key,
                                         order_by=events.c.id.desc())
        ranked = (sa.select(events.c.asset_key, events.c.id, rank.label("rank"))
                  .where(events.c.dagster_event_type == event_type.value,
                         events.c.asset_key.in_(list(plain))).subquery())
        query = (sa.select(ranked.c.asset_key, ranked.c.id).where(ranked.c.rank <= limit)
                 .order_by(ranked.c.id.desc()))
        with storage.index_connection() as conn:
            rows = conn.execute(query).fetchall()
        found: dict[dg.AssetKey, list[int]] = {key: [] for key in plain.values()}
        for key_text, storage_id in rows:
            found[plain[key_text]].append(storage_id)
        out.update(found)
    return out


def asset_event_records(instance: dg.DagsterInstance, storage_ids: Sequence[int]
                        ) -> dict[int, dg.EventLogRecord] | None:
    """The event records of these storage ids of the event log's asset index, in one
    query per 2,000 (an unreadable one is left out, as `fetch_*` leave it). None when the
    event log is not Dagster's SQL one."""
    import sqlalchemy as sa
    from dagster._core.storage.event_log.schema import SqlEventLogStorageTable as events
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
    from dagster._serdes import deserialize_value

    storage = instance.event_log_storage
    if not isinstance(storage, SqlEventLogStorage):
        return None
    out: dict[int, dg.EventLogRecord] = {}
    for chunk in _chunks(sorted(set(storage_ids))):
        query = sa.select(events.c.id, events.c.event).where(events.c.id.in_(chunk))
        with storage.index_connection() as conn:
            rows = conn.execute(query).fetchall()
        for storage_id, text in rows:
            try:
                entry = deserialize_value(text, dg.EventLogEntry)
            except Exception:  # noqa: BLE001, S112 - unreadable: left out, as Dagster does
                continue
            out[storage_id] = dg.EventLogRecord(storage_id=storage_id, event_log_entry=entry)
    return out


def newest_tagged_run_ids(instance: dg.DagsterInstance, key: str, values: Sequence[str]
                          ) -> dict[str, str] | None:
    """value -> the id of the newest run tagged `key: value` (what
    `get_run_records(RunsFilter(tags={key: value}), limit=1)` returns), ranked in one
    query per 2,000 values; a value without a run is absent. None when the run storage is
    not Dagster's SQL one."""
    import sqlalchemy as sa
    from dagster._core.storage.runs.schema import RunsTable as runs
    from dagster._core.storage.runs.schema import RunTagsTable as tags
    from dagster._core.storage.runs.sql_run_storage import SqlRunStorage

    storage = instance.run_storage
    if not isinstance(storage, SqlRunStorage):
        return None
    out: dict[str, str] = {}
    for chunk in _chunks(sorted(set(values))):
        rank = sa.func.row_number().over(partition_by=tags.c.value, order_by=runs.c.id.desc())
        ranked = (sa.select(tags.c.value, runs.c.run_id, rank.label("rank"))
                  .select_from(runs.join(tags, runs.c.run_id == tags.c.run_id))
                  .where(tags.c.key == key, tags.c.value.in_(list(chunk))).subquery())
        query = sa.select(ranked.c.value, ranked.c.run_id).where(ranked.c.rank == 1)
        with storage.connect() as conn:
            out.update(dict(conn.execute(query).fetchall()))
    return out
