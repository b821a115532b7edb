"""Other ways to build the code location's harvester definitions, measured against
today's (case 12). `use(path)` puts a path's builders in place of the ones in
`oaipmh_dagster.definitions` for the rest of the process:

- `private`: as built until 2026-12-02, through Dagster's private API: one op
  definition shared by every harvester, copied under each harvester's name without
  running its constructor again (`renamed_op`), and each harvester's job built by
  `build_asset_job` against an `AssetGraph` of its own assets (`build_job`);
- `multi_asset`: a `@dg.multi_asset(name=..., pool=..., can_subset=True)` per harvester
  instead of an op and the `AssetsDefinition` constructor (today's jobs);
- `location_resolved`: today's assets, each harvester's `define_asset_job` left to the
  code location's `Definitions` to resolve, against the whole asset graph;
- `public`: today's builders."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.definitions.assets.job.asset_job import build_asset_job
from dagster._core.definitions.utils import check_valid_name
from dagster._core.execution.with_resources import wrap_resources_for_execution

from oaipmh_dagster.contracts import RAW_RECORDS, RECORDS, op_name
from oaipmh_dagster.defs import assets as assets_mod
from oaipmh_dagster.defs.jobs import run_tags
from oaipmh_dagster.defs.listener import LISTENER_KEY
from oaipmh_dagster.storage.registry import Harvester

PATHS = ("public", "private", "multi_asset", "location_resolved")
RESOURCE_KEYS = frozenset({"oaipmh_db", LISTENER_KEY})


def _description(h: Harvester) -> str:
    return (f"Harvest {h.name} from {h.base_url} ({h.metadata_prefix}) into the record "
            "store: raw_records, then records.")


# -- private ---------------------------------------------------------------------------


@functools.cache
def _shared_op() -> dg.OpDefinition:
    """The one op definition every harvester's copy comes from."""
    return dg.op(name="harvest", out=assets_mod._OUTS,  # noqa: SLF001 - same outputs
                 config_schema=assets_mod.HARVEST_CONFIG_SCHEMA,
                 required_resource_keys=set(RESOURCE_KEYS))(assets_mod.harvest)


def renamed_op(op: dg.OpDefinition, name: str, description: str, pool: str) -> dg.OpDefinition:
    """A copy of `op` under another name, its constructor not run again."""
    copy = object.__new__(type(op))
    copy.__dict__.update(op.__dict__)
    copy._name = check_valid_name(name)  # noqa: SLF001 - the private baseline
    copy._description = description  # noqa: SLF001
    copy._pool = pool  # noqa: SLF001
    return copy


def private_assets(h: Harvester) -> list[dg.AssetsDefinition]:
    """The source spec and the harvest assets of one harvester, on a renamed op."""
    source, raw, records = assets_mod.harvester_specs(h)
    op = renamed_op(_shared_op(), op_name(h.id), f"Harvest {h.name} ({h.base_url}).",
                    assets_mod.host_pool(h))
    harvest_assets = dg.AssetsDefinition(
        keys_by_input_name={}, keys_by_output_name={RAW_RECORDS: raw.key, RECORDS: records.key},
        node_def=op, can_subset=True, specs=[raw, records])
    return [dg.AssetsDefinition(specs=[source]), harvest_assets]


def private_job(h: Harvester, assets: Sequence[dg.AssetsDefinition],
                resources: Mapping[str, Any]) -> dg.JobDefinition:
    """The harvester's asset job, built against a graph of its own assets."""
    return build_asset_job(
        h.job_name, asset_graph=AssetGraph.from_assets(list(assets)),
        allow_different_partitions_defs=False,
        resource_defs=wrap_resources_for_execution(dict(resources)),
        description=_description(h), tags=run_tags(h), executor_def=dg.in_process_executor)


# -- public alternatives -----------------------------------------------------------------


def multi_asset_assets(h: Harvester) -> list[dg.AssetsDefinition]:
    """The harvest assets of one harvester as a `@dg.multi_asset` (outputs named after
    the assets: the op then has an input per dependency)."""
    source, raw, records = assets_mod.harvester_specs(h)
    outs = {RAW_RECORDS: dg.AssetOut.from_spec(raw.replace_attributes(deps=[]),
                                               is_required=False),
            RECORDS: dg.AssetOut.from_spec(records.replace_attributes(deps=[]),
                                           is_required=False)}
    harvest_assets = dg.multi_asset(
        name=op_name(h.id), outs=outs, deps=[source.key],
        internal_asset_deps={RAW_RECORDS: {source.key}, RECORDS: {raw.key}},
        can_subset=True, pool=assets_mod.host_pool(h),
        description=f"Harvest {h.name} ({h.base_url}).",
        config_schema=assets_mod.HARVEST_CONFIG_SCHEMA, required_resource_keys=set(RESOURCE_KEYS),
    )(assets_mod.harvest)
    return [dg.AssetsDefinition(specs=[source]), harvest_assets]


def unresolved_job(h: Harvester, assets: Sequence[dg.AssetsDefinition],
                   resources: Mapping[str, Any]) -> Any:
    """The harvester's `define_asset_job`, left for the location to resolve."""
    return dg.define_asset_job(
        h.job_name, selection=[key for a in assets if a.is_executable for key in a.keys],
        description=_description(h), tags=run_tags(h), executor_def=dg.in_process_executor)


def use(path: str) -> None:
    """Build the code location's harvester definitions through `path` from now on."""
    from oaipmh_dagster import definitions

    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}: one of {', '.join(PATHS)}")
    if path == "private":
        definitions.build_harvester_assets = private_assets  # type: ignore[assignment]
        definitions.build_harvest_job = private_job  # type: ignore[assignment]
    elif path == "multi_asset":
        definitions.build_harvester_assets = multi_asset_assets  # type: ignore[assignment]
    elif path == "location_resolved":
        definitions.build_harvest_job = unresolved_job  # type: ignore[assignment]
