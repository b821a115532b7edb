"""The code location: one job, one schedule and three assets per registered harvester
(of its shard, when its name names one: see `shards`), plus the since sensor. Runs
rebuild it from the rows stored in reconstruction metadata,
never from the registry, so a row changed or removed since the last load cannot break a
run that was launched against it.

`load_definitions()` builds what the location serves; a module of one's own can serve it
with assets downstream of `oaipmh/<id>/records` (see `defs.records_io`):

    @dg.definitions
    def defs() -> dg.Definitions:
        return dg.Definitions.merge(load_definitions(), dg.Definitions(assets=[mine]))
"""

from __future__ import annotations

import gc
import json
import logging
import warnings

import dagster as dg

from oaipmh_dagster.contracts import ROWS_KEY
from oaipmh_dagster.defs._private import LoadContext
from oaipmh_dagster.defs.alerts import build_alert_sensor
from oaipmh_dagster.defs.assets import build_harvester_assets
from oaipmh_dagster.defs.checks import build_location_checks
from oaipmh_dagster.defs.jobs import build_harvest_job
from oaipmh_dagster.defs.listener import LISTENER_KEY, listener_resource
from oaipmh_dagster.defs.manage import build_manage_job, hosts_manage_job, registry_asset
from oaipmh_dagster.defs.records_io import (
    RECORDS_IO_MANAGER_KEY,
    RecordBatches,
    records_io_manager,
)
from oaipmh_dagster.defs.resources import OAIPMHDatabase
from oaipmh_dagster.defs.schedules import build_schedule
from oaipmh_dagster.defs.sensors import build_since_sensor
from oaipmh_dagster.operations.shards import InvalidShard, Shard, parse_location
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, InvalidRow, Registry, harvester_table

__all__ = ["ROWS_KEY", "RecordBatches", "build_definitions", "defs", "freeze_long_lived",
           "load_definitions", "load_harvesters", "location_shard"]

log = logging.getLogger(__name__)


def location_shard(registry: Registry, location: str | None) -> Shard | None:
    """The shard the code location named `location` serves (None: every harvester): a
    `..._shard_<i>` name takes K from the registry; `InvalidShard` when it names no
    shard of the stored K (K unset, or i >= K: a location left over from a larger K)."""
    parsed = parse_location(location)
    if parsed is None:
        return None
    return Shard.of_location(location, registry.shard_count() if parsed[1] is None else None)


def load_harvesters(shard: Shard | None = None, location: str | None = None
                    ) -> list[Harvester]:
    """The registry's valid rows (of `shard`, or of the shard `location` names: the
    other rows are not read); a missing table (fresh install) gives none, and so does
    a shard location whose shard is not one of the stored K (logged)."""
    engine = db.get_engine(migrate=False)
    if not db.table_exists(engine, harvester_table.name):
        log.warning("no harvester table in %s yet: run `oaipmh-dagster init` or add a "
                    "harvester; the code location is empty", db.redact(str(engine.url)))
        return []
    registry = Registry(engine)
    if shard is None and location is not None:
        try:
            shard = location_shard(registry, location)
        except InvalidShard as exc:
            log.error("code location %s holds no harvesters: %s", location, exc)
            return []
        if shard is not None:
            log.info("code location %s serves shard %d of %d", location, shard.index,
                     shard.count)
    rows = registry.list_rows(shard.holds if shard is not None else None)
    for row in rows:
        if isinstance(row, InvalidRow):
            log.error("harvester row %r is invalid and was left out: %s", row.id, row.error)
    return [r for r in rows if isinstance(r, Harvester)]


def build_definitions(
    harvesters: list[Harvester], location_name: str | None = None
) -> dg.Definitions:
    """Definitions for `harvesters` (a loop over factories; no I/O). The since sensor
    takes only `location_name`'s runs of these harvesters."""
    resources = {"oaipmh_db": OAIPMHDatabase(), LISTENER_KEY: listener_resource(),
                 RECORDS_IO_MANAGER_KEY: records_io_manager}
    assets, jobs, schedules = [], [], []
    for h in harvesters:
        harvester_assets = build_harvester_assets(h)
        job = build_harvest_job(h, harvester_assets, resources)
        assets.extend(harvester_assets)
        jobs.append(job)
        schedules.append(build_schedule(h, job))
    checks = build_location_checks(harvesters)
    if checks is not None:
        assets.append(checks)
    sensors = [build_since_sensor(harvesters, location_name)]
    alert = build_alert_sensor(harvesters, location_name)  # only with OAIPMH_ALERT_WEBHOOK
    if alert is not None:
        sensors.append(alert)
    if hosts_manage_job(location_name):  # one per deployment: unsharded, or shard 0
        jobs.append(build_manage_job())
        assets.append(registry_asset)
    return dg.Definitions(
        assets=assets,
        jobs=jobs,
        schedules=schedules,
        sensors=sensors,
        resources=resources,
    )


def freeze_long_lived() -> None:
    """Move the objects alive now (modules, classes, functions: Dagster alone brings
    about 450,000) out of the garbage collector's sight for the process's lifetime.
    Each full collection while the definitions are built, validated and snapshotted
    would otherwise walk them all again: at 1,000 harvesters one more or one fewer
    such collection moved the load time by 0.2 s. Once per process."""
    if not gc.get_freeze_count():
        gc.collect()
        gc.freeze()


def load_definitions() -> dg.Definitions:
    """What the code location serves: the harvesters of its shard (from the registry on a
    load, from the rows a run worker was handed on reconstruction), handed on to its run
    workers. Call it while Dagster loads the location (from a `@dg.definitions` function,
    as `defs` does) so that it knows the location's name and shard; merge assets of
    one's own into what it returns."""
    freeze_long_lived()
    context = LoadContext()
    location = context.location_name
    stored = context.reconstructed(ROWS_KEY)
    if stored is not None:
        harvesters = [Harvester.from_dict(d) for d in json.loads(stored)]
    else:
        harvesters = load_harvesters(location=location)
    rows = json.dumps([h.to_dict() for h in harvesters], sort_keys=True)
    # Only the load context's pending metadata reaches the repository load data that run
    # workers are rebuilt from (`with_reconstruction_metadata` alone does not).
    context.hand_to_run_workers(ROWS_KEY, rows)
    built = build_definitions(harvesters, location)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)  # a documented Dagster API
        return built.with_reconstruction_metadata({ROWS_KEY: rows})


@dg.definitions
def defs() -> dg.Definitions:
    """Entry point of the code location (workspace.yaml: module oaipmh_dagster.definitions)."""
    return load_definitions()
