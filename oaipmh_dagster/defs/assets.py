"""Per-harvester assets: `oaipmh/<id>/source` (the endpoint) -> `raw_records` ->
`records`, materialized by one op (raw first, then records). Their asset checks are
declared in `checks`; the harvester's own job evaluates them in this op."""


from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import dagster as dg

from oaipmh_dagster.contracts import (
    ADVANCES_SINCE_KEY,
    CHECK_COMPLETE,
    CHECK_NO_FAILED,
    CHECK_SCHEMA_VALID,
    HARVESTER_TAG,
    HOST_TAG,
    LISTS_JUDGED_KEY,
    MODE_INCREMENTAL,
    MODE_TAG,
    NEXT_SINCE_KEY,
    RAW_RECORDS,
    RECONCILE_TAG,
    RECORDS,
    RESPONSE_DATE_KEY,
    SCHEDULE_TAG,
    SCOPE_KEY,
    SHORT_LISTS_KEY,
    SINCE_KEY,
    SINCE_NOTE_KEY,
    SINCE_SOURCE_KEY,
    SINCE_SOURCE_TAG,
    SINCE_TAG,
    asset_paths,
    group_name,
    harvester_of,
    op_name,
)
from oaipmh_dagster.contracts import host_pool as _host_pool
from oaipmh_dagster.defs.catalog import asset_owners, asset_tags
from oaipmh_dagster.defs.checks import as_evaluation, evaluate_checks
from oaipmh_dagster.defs.config import HarvestConfig
from oaipmh_dagster.defs.freshness import freshness_policy
from oaipmh_dagster.defs.lineage import (
    ROW_COUNT_KEY,
    observe_source,
    records_code_version,
    table_metadata,
)
from oaipmh_dagster.defs.listener import LISTENER_KEY
from oaipmh_dagster.defs.records_io import RECORDS_IO_MANAGER_KEY
from oaipmh_dagster.defs.resources import OAIPMHDatabase
from oaipmh_dagster.defs.retry import retry_transient
from oaipmh_dagster.defs.since import ResolvedSince, resolve_since, run_mode
from oaipmh_dagster.harvesting import harvest as harvest_mod
from oaipmh_dagster.harvesting.plan import SinceChoice
from oaipmh_dagster.harvesting.rows import retransform
from oaipmh_dagster.oai import Identify
from oaipmh_dagster.storage.ports import RecordStore
from oaipmh_dagster.storage.registry import Harvester

RECORD_COLUMNS = dg.TableSchema(
    columns=[
        dg.TableColumn("oai_identifier", "string", description="OAI identifier (unique per harvester)"),
        dg.TableColumn("datestamp", "string", description="Header datestamp, ISO 8601 UTC"),
        dg.TableColumn("deleted", "bool", description="Tombstone: the server deleted it"),
        dg.TableColumn("sets", "list[string]", description="setSpecs of the header"),
        dg.TableColumn("metadata", "json", description="Transformed metadata (null when deleted)"),
        dg.TableColumn("errors", "list[json]", description="type/message/location of failures"),
    ]
)

# Inferred once: inferring it from the annotation per harvester costs ~1 ms each.
HARVEST_CONFIG_SCHEMA = HarvestConfig.to_fields_dict()
# The outputs of every harvester's op (records alone re-transforms the stored raw XML).
# records is of type Any under the records IO manager, so an asset that takes it as an
# input receives the live records (`records_io`); the op yields no value for it, and
# Dagster then calls no IO manager to store one.
_OUTS = {RAW_RECORDS: dg.Out(dg.Nothing, is_required=False),
         RECORDS: dg.Out(dg.Any, is_required=False, io_manager_key=RECORDS_IO_MANAGER_KEY)}

__all__ = ["RECONCILE_TAG", "SCHEDULE_TAG", "asset_keys", "build_harvester_assets",
           "group_name", "harvest", "harvester_specs", "host_pool", "op_name", "run_harvest"]


def asset_keys(harvester_id: str) -> tuple[dg.AssetKey, dg.AssetKey, dg.AssetKey]:
    """(source, raw_records, records) keys of a harvester."""
    source, raw, records = asset_paths(harvester_id)
    return dg.AssetKey(source), dg.AssetKey(raw), dg.AssetKey(records)


def host_pool(h: Harvester) -> str:
    """The Dagster concurrency pool of every op that harvests from `h`'s host: it limits
    requests to shared servers whichever job runs the op (the harvester's job, the asset
    graph's Materialize, a backfill)."""
    return _host_pool(h.host)


def harvester_specs(h: Harvester) -> tuple[dg.AssetSpec, dg.AssetSpec, dg.AssetSpec]:
    """The specs of a harvester's source, raw_records and records assets."""
    source_key, raw_key, records_key = asset_keys(h.id)
    group = group_name(h.id)
    sets = ", ".join(h.sets) or "(whole repository)"
    # The catalog filters by these (host, prefix, set; owners from the environment).
    tags, owners = asset_tags(h), asset_owners()
    source = dg.AssetSpec(
        source_key,
        description=f"OAI-PMH endpoint {h.base_url} (metadataPrefix {h.metadata_prefix}, "
        f"sets {sets}). Not materialized here: the remote repository; each harvest "
        "observes it from its Identify answer.",
        group_name=group,
        kinds={"oaipmh"}, tags=tags, owners=owners,
        metadata={"url": dg.MetadataValue.url(h.base_url), "metadata_prefix": h.metadata_prefix,
                  "sets": sets},
    )
    raw = dg.AssetSpec(
        raw_key, deps=[source_key], group_name=group, kinds={"oaipmh", "xml"},
        tags=tags, owners=owners, freshness_policy=freshness_policy(h),
        description=f"Headers and raw {h.metadata_prefix} XML of {h.name}, upserted per "
        "page into oaipmh_record (deleted records kept as tombstones).",
        skippable=True,
    )
    records = dg.AssetSpec(
        records_key, deps=[raw_key], group_name=group, kinds={"oaipmh", "json"},
        tags=tags, owners=owners, code_version=records_code_version(h.transformer),
        description=f"Records of {h.name} transformed by '{h.transformer}' into JSON "
        "(re-materializing only this asset re-transforms the stored raw XML).",
        # The column schema rides on each materialization, not on the spec: on the
        # spec it was 1.5 KB of every harvester's share of the repository snapshot.
        skippable=True,
    )
    return source, raw, records


def build_harvester_assets(h: Harvester) -> list[dg.AssetsDefinition]:
    """The source spec and the harvest assets of one harvester: op `harvest_<id>` in the
    harvester's host pool, outputs `raw_records` and `records` (either may be selected
    alone). An op and the `AssetsDefinition` constructor cost a third of the
    `@dg.multi_asset` decorator here (0.33 s against 0.6 s at 200 harvesters), and keep
    the op's outputs named after the assets, with no inputs."""
    source, raw, records = harvester_specs(h)
    op = dg.op(name=op_name(h.id), description=f"Harvest {h.name} ({h.base_url}).",
               pool=host_pool(h), out=_OUTS, config_schema=HARVEST_CONFIG_SCHEMA,
               required_resource_keys={"oaipmh_db", LISTENER_KEY})(harvest)
    harvest_assets = dg.AssetsDefinition(
        keys_by_input_name={},
        keys_by_output_name={RAW_RECORDS: raw.key, RECORDS: records.key},
        node_def=op,
        can_subset=True,
        specs=[raw, records],
    )
    return [dg.AssetsDefinition(specs=[source]), harvest_assets]


def harvest(context: dg.AssetExecutionContext) -> Any:
    """The body of every harvester's op; its harvester is the one its asset keys name."""
    config = HarvestConfig(**context.op_config)
    listener: harvest_mod.Listener = getattr(context.resources, LISTENER_KEY)
    with retry_transient(context, listener.on_retry):
        yield from run_harvest(context, config, context.resources.oaipmh_db,
                               _harvester_id(context.assets_def.keys))


def _harvester_id(keys: Any) -> str:
    """The harvester whose assets an op materializes (from their keys)."""
    ids = {harvester_of(key.path) for key in keys}
    if len(ids) != 1 or None in ids:
        raise dg.Failure(f"not the assets of one harvester: {sorted(map(str, keys))}")
    return str(ids.pop())


def run_harvest(
    context: dg.AssetExecutionContext, config: HarvestConfig, oaipmh_db: OAIPMHDatabase,
    harvester_id: str,
) -> Any:
    """The op body: harvest (raw_records) and/or re-transform (records), then report; a
    sweep held back (see `sweep`) is reported with the rest, then fails the run."""
    h = oaipmh_db.harvester(harvester_id)
    _, raw_key, records_key = asset_keys(h.id)
    selected = context.selected_asset_keys
    tag_run(context, h, config if raw_key in selected else None)
    store = oaipmh_db.record_store()
    counts: dict[str, Any] | None = None
    totals: dict[str, int] | None = None  # the store's counts after the harvest
    held = None
    if raw_key in selected:
        stats, totals = yield from _harvest_raw(context, config, h, store)
        held = stats.held_back
        counts = {"new": stats.new, "updated": stats.updated, "deleted": stats.deleted,
                  "failed": stats.failed, "failed_ids": stats.failed_ids}
    if records_key in selected:
        yield from _materialize_records(context, h, store, counts, totals)
    if held is not None:
        context.log.error(held.message())
        raise dg.Failure(description=held.message(), metadata=held.metadata(),
                         allow_retries=False)


def _harvest_raw(context: dg.AssetExecutionContext, config: HarvestConfig, h: Harvester,
                 store: RecordStore) -> Any:
    """Harvest into the store, observing `source` from the Identify answer, and
    materialize raw_records; returns the statistics (a sweep held back included) and
    the store's counts of the harvester after it (read once: each is a pass over the
    harvester's rows, 0.3-0.5 s at 500,000 records on SQLite)."""
    source_key, raw_key, _ = asset_keys(h.id)
    reconcile = wants_reconcile(context.instance, context.dagster_run, h, config.reconcile)
    resolver = _SinceAtLease(context, config, h, reconcile)
    listener: harvest_mod.Listener = getattr(context.resources, LISTENER_KEY)
    hooks = harvest_mod.HarvestHooks(resolve_since=resolver,
                                     is_stale=_stale_check(context.instance),
                                     on_page=listener.on_page)
    run = harvest_mod.RunOptions(until=config.until, oai_ids=config.oai_ids,
                                 sets=config.sets, reconcile=reconcile,
                                 # a retry continues this run's own checkpoint
                                 resume=config.resume or context.retry_number > 0,
                                 allow_mass_delete=config.allow_mass_delete)

    def harvest_once(on_identify: Callable[[Identify], None]) -> harvest_mod.HarvestStats:
        try:
            return harvest_mod.harvest(h, store, run, run_id=context.run_id,
                                       logger=context.log,
                                       hooks=replace(hooks, on_identify=on_identify))
        except harvest_mod.MassDeleteHeldBack as exc:
            return exc.stats  # reported like any harvest, then the run fails

    stats = yield from observe_source(source_key, harvest_once)
    if listener.on_finish is not None:
        listener.on_finish(stats)
    assert resolver.resolved is not None  # the harvest resolves since before any list
    totals = store.counts(h.id)
    meta = {**raw_metadata(stats, resolver.resolved),
            **table_metadata(store, h.id, live=totals["live"])}
    note = meta.get(SINCE_NOTE_KEY)
    if note:
        context.log.warning(str(note))
    yield dg.MaterializeResult(asset_key=raw_key, metadata=meta)
    log_own_checks(context, h, {CHECK_COMPLETE, CHECK_SCHEMA_VALID}, totals)
    return stats, totals


class _SinceAtLease:
    """The harvest's `resolve_since` hook: resolves since once the lease is held (after
    any harvest it waited for), logs and tags the run with it, and keeps it."""

    def __init__(self, context: dg.AssetExecutionContext, config: HarvestConfig,
                 h: Harvester, reconcile: bool) -> None:
        self.context, self.config, self.h, self.reconcile = context, config, h, reconcile
        self.resolved: ResolvedSince | None = None

    def __call__(self) -> SinceChoice:
        context, config, h = self.context, self.config, self.h
        resolved = resolve_since(context.instance, h, since=config.since, full=config.full,
                                 raw_key=asset_keys(h.id)[1])
        self.resolved = resolved
        if resolved.note:
            context.log.warning(resolved.note)
        context.log.info(
            "harvesting %s (%s, prefix %s, sets %s) since=%s (from %s%s) until=%s%s",
            h.id, h.base_url, h.metadata_prefix, list(config.sets or h.sets) or "all",
            resolved.value or "-", resolved.source,
            ", asked with the harvester's overlap" if resolved.overlap else "",
            config.until or "-",
            f", {len(config.oai_ids)} identifiers" if config.oai_ids else "",
        )
        context.instance.add_run_tags(context.run_id, {
            SINCE_TAG: resolved.value or "full", SINCE_SOURCE_TAG: resolved.source,
            **({RECONCILE_TAG: "true"} if self.reconcile else {}),
        })
        return resolved.choice(config.full)


def _stale_check(instance: dg.DagsterInstance) -> Callable[[str | None], bool]:
    """The harvest's `is_stale` hook: whether the run holding a lease has ended."""
    def is_stale(other_run: str | None) -> bool:
        if other_run is None:
            return True
        record = instance.get_run_by_id(other_run)
        return record is None or record.is_finished

    return is_stale


def _materialize_records(context: dg.AssetExecutionContext, h: Harvester, store: RecordStore,
                         counts: dict[str, Any] | None,
                         totals: dict[str, int] | None = None) -> Any:
    """Materialize records: after a harvest (its `counts`, and the store's `totals`
    after it), or alone, re-transforming the stored raw XML."""
    records_key = asset_keys(h.id)[2]
    if counts is None:
        context.log.info("re-transforming the stored raw XML of %s with %s",
                         h.id, h.transformer)
        result = retransform(store, h.id, harvest_mod.make_transform(h.transformer),
                             run_id=context.run_id, logger=context.log,
                             validate=harvest_mod.make_validate(h))
        counts = {"new": 0, "updated": result.updated, "failed": result.failed,
                  "failed_ids": result.failed_ids}
    unchanged = not (counts["new"] or counts["updated"] or counts.get("deleted"))
    totals = totals or store.counts(h.id)
    records_meta = records_metadata(
        store, h, counts, run_id=context.run_id, totals=totals,
        previous=latest_metadata(context.instance, records_key) if unchanged else None)
    yield dg.MaterializeResult(asset_key=records_key, metadata=records_meta)
    log_own_checks(context, h, {CHECK_NO_FAILED}, totals)


def log_own_checks(context: dg.AssetExecutionContext, h: Harvester, names: set[str],
                   totals: dict[str, int] | None = None) -> None:
    """In the harvester's own job, evaluate its checks `names` after the materialization
    they judge and log their evaluations. The job holds no check op (one per harvester
    job cost load time); elsewhere the code location's check op evaluates the selected
    checks after the harvest."""
    if context.job_name != h.job_name:
        return
    for result in evaluate_checks(context.instance, context.resources.oaipmh_db, h.id, names,
                                  totals):
        context.log_event(as_evaluation(result))


def tag_run(context: dg.AssetExecutionContext, h: Harvester,
            harvest: HarvestConfig | None = None) -> None:
    """Give a run that materializes this harvester's assets alone its harvester and host
    tags when it was launched without them (the asset graph's Materialize, a backfill:
    Dagster's implicit asset job carries no harvester's tags), so the views and guards
    that find a harvester's runs by tag (the schedule's skip, `harvester list`, the Runs
    page filter, the run queue's limits for runs queued after it) see it once it runs.
    A run that harvests (`harvest`: its config) without an `oaipmh/mode` tag (launched
    from the Launchpad, the asset graph or `oaipmh-dagster harvest`) gets the one its
    schedule would give it (`run_mode`). A run of several harvesters' assets cannot carry
    one harvester's tags: it is left alone (the op's host pool and the store's lease
    still hold for it)."""
    run = context.dagster_run
    wanted = {HARVESTER_TAG: h.id, HOST_TAG: h.host}
    missing = {key: value for key, value in wanted.items() if run.tags.get(key) != value}
    wants_mode = harvest is not None and MODE_TAG not in run.tags
    if not missing and not wants_mode:
        return
    if not _of_one_harvester(run, h):
        context.log.info("this run materializes the assets of several harvesters: it "
                         "carries no harvester's tags")
        return
    if harvest is not None and wants_mode:
        missing[MODE_TAG] = (MODE_INCREMENTAL if harvest.oai_ids  # a few records, no list
                             else run_mode(context.instance, h, asset_keys(h.id)[1],
                                           since=harvest.since, full=harvest.full))
    context.instance.add_run_tags(run.run_id, missing)


def _of_one_harvester(run: dg.DagsterRun, h: Harvester) -> bool:
    """Whether `run` materializes the assets of `h` and of no other harvester (its own
    job, or a selection of them, with or without assets downstream of them that are no
    harvester's)."""
    if run.job_name == h.job_name:
        return True
    selection = run.asset_selection  # None: every asset of a job (not one harvester's)
    return selection is not None and (
        {harvester_of(key.path) for key in selection} - {None} == {h.id})


def wants_reconcile(instance: dg.DagsterInstance, run: dg.DagsterRun, h: Harvester,
                    asked: bool | None) -> bool:
    """Whether this run reconciles: as its config says, else on a scheduled run when none
    of the harvester's previous `reconcile_every - 1` scheduled runs reconciled with
    success (so every Nth scheduled run, and the first; a failed one is tried again)."""
    if asked is not None:
        return asked
    every = h.reconcile_every
    if not every or run.tags.get(SCHEDULE_TAG) != h.job_name:
        return False
    if every == 1:
        return True
    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={HARVESTER_TAG: h.id, SCHEDULE_TAG: h.job_name}),
        limit=every,
    )
    previous = [r.dagster_run for r in records if r.dagster_run.run_id != run.run_id]
    return not any(p.tags.get(RECONCILE_TAG) == "true"
                   and p.status == dg.DagsterRunStatus.SUCCESS
                   for p in previous[:every - 1])


def raw_metadata(stats: harvest_mod.HarvestStats, resolved: ResolvedSince) -> dict:
    """Materialization metadata of raw_records: the harvest's statistics, and the since
    it records (`oai/next_since`, when `oai/advances_since`) for its `oai/scope`."""
    notes = [stats.since_note] if stats.since_note else []
    if not resolved.covers_stored():
        notes.append(f"since does not advance: the run started at {resolved.value}, after "
                     f"the harvester's since {resolved.stored or '(none: never harvested in full)'}")
    if stats.held_back is not None:
        notes.append(f"since does not advance: the {stats.held_back.sweep} sweep was held back")
    advances = (stats.covers_selection and resolved.covers_stored()
                and stats.next_since is not None and stats.held_back is None)
    meta: dict[str, Any] = {
        RESPONSE_DATE_KEY: stats.response_date or "",
        NEXT_SINCE_KEY: stats.next_since or "",
        ADVANCES_SINCE_KEY: advances,
        SCOPE_KEY: stats.scope,
        SINCE_NOTE_KEY: "; ".join(notes),
        "oai/mode": stats.mode,
        SINCE_KEY: stats.since or "",
        SINCE_SOURCE_KEY: resolved.source,
        "oai/until": stats.until or "",
        "oai/granularity": stats.granularity,
        LISTS_JUDGED_KEY: stats.lists_judged,
        SHORT_LISTS_KEY: "; ".join(map(harvest_mod.describe_short, stats.short_lists)),
        "oai/sets": ", ".join(stats.sets) or "(all)",
        "records": stats.records,
        "new": stats.new,
        "updated": stats.updated,
        "deleted": stats.deleted,
        "unchanged": stats.unchanged,
        "failed": stats.failed,
        "pages": stats.pages,
        "requests": stats.requests,
        "retries": stats.retries,
        "bytes": stats.bytes,
        "duration_s": round(stats.duration, 3),
        "records_per_second": round(stats.records_per_second, 1),
    }
    if stats.complete_list_size is not None:
        meta["oai/complete_list_size"] = stats.complete_list_size
    if stats.resumed_from_token:
        meta["oai/resumed_from_token"] = stats.resumed_from_token
    meta.update(_sweep_metadata(stats))
    meta["oai/reconcile"] = stats.reconcile is not None
    if stats.reconcile is not None:
        r = stats.reconcile
        meta.update({"oai/reconcile_listed": r.listed,
                     "oai/reconcile_missing_fetched": r.missing_fetched,
                     "oai/reconcile_stale_fetched": r.stale_fetched,
                     "oai/reconcile_tombstoned": r.tombstoned,
                     "oai/reconcile_kept": r.kept,
                     "oai/reconcile_vanished": r.vanished})
    return meta


def _sweep_metadata(stats: harvest_mod.HarvestStats) -> dict[str, Any]:
    """What the run's sweeps did or held back (see `sweep`)."""
    meta: dict[str, Any] = {"oai/sweep_held_back": stats.held_back is not None}
    if stats.held_back is not None:
        meta.update(stats.held_back.metadata())
    if stats.selection_swept is not None:
        meta["oai/selection_swept"] = stats.selection_swept
    if stats.sweep_pending:
        meta["oai/selection_sweep_pending"] = True
    return meta


def records_metadata(store: RecordStore, h: Harvester, counts: dict, *, run_id: str,
                     previous: Mapping[str, Any] | None = None,
                     totals: dict[str, int] | None = None) -> dict:
    """Materialization metadata of records: row count, preview, schema, failures, and
    the field coverage of the live records (`oaipmh.profile`: a sample past
    `ASSET_MAX_RECORDS`, said in `coverage_note`). `previous` is the metadata of the asset's
    latest materialization, given when this run changed no record: its coverage is
    carried over (a profile reads up to 20,000 records: about 1-2 s that an incremental
    run finding nothing new would pay every time) when its live count still holds;
    `coverage_run` names the run whose records were profiled."""
    from oaipmh_dagster.operations.profile import (
        ASSET_MAX_RECORDS,
        coverage_markdown,
        note,
        profile_store,
    )

    totals = totals or store.counts(h.id)
    coverage = _carried_coverage(previous, totals["live"])
    if coverage is None:
        profile = profile_store(store, h.id, max_records=ASSET_MAX_RECORDS,
                                live=totals["live"])
        coverage = {
            "coverage": dg.MetadataValue.json(profile.coverage()),
            "coverage_table": dg.MetadataValue.md(coverage_markdown(profile)),
            "coverage_note": note(profile),
            "coverage_run": run_id,
        }
    return {
        **table_metadata(store, h.id, live=totals["live"]),
        "dagster/column_schema": RECORD_COLUMNS,
        "deleted_in_store": totals["deleted"],
        "transformed": counts["new"] + counts["updated"],
        "failed": counts["failed"],
        "failed_in_store": totals["failed"],
        "transformer": h.transformer,
        "preview": dg.MetadataValue.md(preview_markdown(store, h.id)),
        **coverage,
    }


_COVERAGE_KEYS = ("coverage", "coverage_table", "coverage_note", "coverage_run")


def latest_metadata(instance: dg.DagsterInstance, key: dg.AssetKey) -> Mapping[str, Any] | None:
    """The metadata of `key`'s latest materialization (None before the first)."""
    event = instance.get_latest_materialization_event(key)
    materialization = event.asset_materialization if event is not None else None
    return materialization.metadata if materialization is not None else None


def _carried_coverage(previous: Mapping[str, Any] | None, live: int) -> dict | None:
    """The coverage entries of `previous` when they describe `live` records."""
    if previous is None or any(k not in previous for k in _COVERAGE_KEYS):
        return None
    row_count = previous.get(ROW_COUNT_KEY)
    if getattr(row_count, "value", row_count) != live:
        return None
    return {k: previous[k] for k in _COVERAGE_KEYS}


def preview_markdown(store: RecordStore, harvester_id: str, rows: int = 10) -> str:
    """The first live records as a Markdown table (tabulate: importing pandas for ten
    rows cost every run about 0.5 s)."""
    from tabulate import tabulate

    from oaipmh_dagster.operations.flat import flatten

    items = []
    for item in store.iter_records(harvester_id, batch=rows * 2):
        if not item["deleted"]:
            items.append(flatten(item, max_len=80))
        if len(items) >= rows:
            break
    if not items:
        return "_no live records_"
    columns = list(dict.fromkeys(c for item in items for c in item))
    keep = [c for c in columns if c in ("oai_identifier", "datestamp", "sets")]
    keep += [c for c in columns if c.startswith("metadata.")][:4]

    def cell(v: object) -> object:
        # A '|' inside a cell (flatten joins lists with ' | ') would split the Markdown row.
        return v.replace("|", "\\|").replace("\n", " ") if isinstance(v, str) else v

    return tabulate([[cell(item.get(c)) for c in keep] for item in items], headers=keep,
                    tablefmt="pipe", missingval="", disable_numparse=True)
