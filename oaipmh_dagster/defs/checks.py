"""The asset checks of each harvester, evaluated from the store alone, apart from the
harvest: one op of the code location evaluates the selected ones.

- `no_failed_records` (records): no stored record failed to transform (a warning);
- `complete_list_size_matches` (raw_records): the last harvest's lists each delivered the
  completeListSize their first page announced (read from its materialization);
- `schema_valid` (raw_records, harvesters that validate): every live record is valid.

The asset graph's Materialize runs those of the selected assets after the harvest; a
check's Execute button (or a job that selects checks only) runs them alone, without
harvesting and without a slot of the host's pool. The harvester's own job evaluates them
in its harvest op, after each materialization (the same functions: the job holds no check
op, so it costs no more to load)."""

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg

from oaipmh_dagster.contracts import (
    CHECK_COMPLETE,
    CHECK_NO_FAILED,
    CHECK_SCHEMA_VALID,
    CHECKS_OP,
    LISTS_JUDGED_KEY,
    RAW_RECORDS,
    RECORDS,
    SHORT_LISTS_KEY,
    asset_paths,
    harvester_of,
)
from oaipmh_dagster.defs.resources import OAIPMHDatabase
from oaipmh_dagster.defs.schema_check import schema_check_result, schema_check_spec
from oaipmh_dagster.storage.ports import RecordStore
from oaipmh_dagster.storage.registry import Harvester

__all__ = ["as_evaluation", "build_location_checks", "check_specs", "complete_check_result",
           "evaluate_checks", "no_failed_check_result"]


def _keys(harvester_id: str) -> tuple[dg.AssetKey, dg.AssetKey]:
    """(raw_records, records) keys of a harvester."""
    _, raw, records = asset_paths(harvester_id)
    return dg.AssetKey(raw), dg.AssetKey(records)


def check_specs(h: Harvester) -> list[dg.AssetCheckSpec]:
    """The harvester's check specs (`schema_valid` only when it validates)."""
    raw, records = _keys(h.id)
    specs = [
        dg.AssetCheckSpec(CHECK_NO_FAILED, asset=records,
                          description="No record failed to transform (warning)."),
        dg.AssetCheckSpec(CHECK_COMPLETE, asset=raw,
                          description="Every list of the last harvest delivered at least "
                          "the completeListSize its first page announced (windowed lists "
                          "are not judged)."),
    ]
    schema = schema_check_spec(h, raw)
    return [*specs, schema] if schema is not None else specs


def build_location_checks(harvesters: Sequence[Harvester]) -> dg.AssetChecksDefinition | None:
    """The checks of every harvester of a code location, in one op that evaluates those
    selected (None without harvesters). One definition for all: one per harvester cost
    about 1 ms of load time each (asset graph, resources, a node of the implicit asset
    job). Each check takes its harvester's assets as inputs, so a run that also
    materializes them evaluates it after them."""
    specs = {f"{spec.name}__{h.id}": spec for h in harvesters for spec in check_specs(h)}
    if not specs:
        return None
    inputs = {f"{name}__{h.id}": key for h in harvesters
              for name, key in zip((RAW_RECORDS, RECORDS), _keys(h.id), strict=True)}

    @dg.op(
        name=CHECKS_OP,
        description="Evaluate the selected asset checks of harvesters from the record store.",
        ins={name: dg.In(dg.Nothing) for name in inputs},
        out={name: dg.Out(None, is_required=False) for name in specs},
        required_resource_keys={"oaipmh_db"},
    )
    def oaipmh_checks(context: dg.OpExecutionContext) -> Iterator[dg.AssetCheckResult]:
        selected: dict[str, set[str]] = {}
        for key in context.selected_asset_check_keys:
            selected.setdefault(str(harvester_of(key.asset_key.path)), set()).add(key.name)
        for harvester_id, names in sorted(selected.items()):
            yield from evaluate_checks(context.instance, context.resources.oaipmh_db,
                                       harvester_id, names)

    return dg.AssetChecksDefinition.create(
        keys_by_input_name=inputs, node_def=oaipmh_checks,
        check_specs_by_output_name=specs, can_subset=True)


def as_evaluation(result: dg.AssetCheckResult) -> dg.AssetCheckEvaluation:
    """A check result as the evaluation event an op logs for a check it does not
    declare (the harvester's own job evaluates its checks in the harvest op)."""
    if result.asset_key is None or result.check_name is None:
        raise ValueError("a check result names its asset and check")
    return dg.AssetCheckEvaluation(
        asset_key=result.asset_key, check_name=result.check_name, passed=result.passed,
        metadata=result.metadata, severity=result.severity)


def evaluate_checks(instance: dg.DagsterInstance, oaipmh_db: OAIPMHDatabase,
                    harvester_id: str, names: set[str], totals: dict[str, int] | None = None
                    ) -> Iterator[dg.AssetCheckResult]:
    """The results of the checks `names` of a harvester, from the store and the last
    materialization of its raw_records (`totals`: the store's `counts` of the harvester
    when the caller has just read them)."""
    h = oaipmh_db.harvester(harvester_id)
    store = oaipmh_db.record_store()
    raw, records = _keys(h.id)
    if CHECK_COMPLETE in names:
        yield complete_check_result(instance.get_latest_materialization_event(raw), raw)
    if CHECK_SCHEMA_VALID in names:
        yield schema_check_result(store, h, raw, live=None if totals is None else totals["live"])
    if CHECK_NO_FAILED in names:
        yield no_failed_check_result(store, h.id, records, totals)


def no_failed_check_result(store: RecordStore, harvester_id: str, records: dg.AssetKey,
                           totals: dict[str, int] | None = None) -> dg.AssetCheckResult:
    """Failed (a warning) when a stored record carries a transformation error
    (`totals`: the store's `counts`, read when not given)."""
    in_store = (totals or store.counts(harvester_id))["failed"]
    failed = store.failed_identifiers(harvester_id, limit=10) if in_store else []
    return dg.AssetCheckResult(
        asset_key=records, check_name=CHECK_NO_FAILED, passed=not failed,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"failed_sample": ", ".join(failed) or "none",
                  "failed_in_store": in_store},
    )


def complete_check_result(event: dg.EventLogEntry | None,
                          raw: dg.AssetKey) -> dg.AssetCheckResult:
    """Failed when a list of the last harvest (raw_records' latest materialization) ended
    short of the completeListSize its first page announced: the lists that keep since
    from advancing. Nothing to judge (no harvest yet, no announced size, a windowed or
    by-identifier harvest) passes, with a note."""
    mat = event.asset_materialization if event is not None else None
    if event is None or mat is None:
        return _passed_note(raw, "no harvest recorded yet: nothing to judge")
    meta = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    judged_run = {"judged_run": event.run_id}
    if LISTS_JUDGED_KEY not in meta:
        return _passed_note(raw, "the last harvest predates the list-size record", judged_run)
    if meta.get(SHORT_LISTS_KEY):
        return dg.AssetCheckResult(
            asset_key=raw, check_name=CHECK_COMPLETE, passed=False,
            metadata={"short_lists": meta[SHORT_LISTS_KEY],
                      "lists_judged": meta[LISTS_JUDGED_KEY], **judged_run})
    if not meta[LISTS_JUDGED_KEY]:
        return _passed_note(raw, "no list to judge: none announced a completeListSize, or "
                            "the harvest was windowed (a window's size is partial) or by "
                            "identifier", judged_run)
    return dg.AssetCheckResult(asset_key=raw, check_name=CHECK_COMPLETE, passed=True,
                               metadata={"lists_judged": meta[LISTS_JUDGED_KEY], **judged_run})


def _passed_note(raw: dg.AssetKey, note: str,
                 extra: Mapping[str, Any] | None = None) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(asset_key=raw, check_name=CHECK_COMPLETE, passed=True,
                               metadata={"note": note, **(extra or {})})
