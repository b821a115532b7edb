"""The job `harvest_oaipmh_records_<id>` of each harvester."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dagster as dg

from oaipmh_dagster.registry import Harvester

HARVESTER_TAG = "oaipmh/harvester"
HOST_TAG = "oaipmh/host"
# Set by the op when the run starts: the since it harvests from, and where that came from.
SINCE_TAG = "oaipmh/since"
SINCE_SOURCE_TAG = "oaipmh/since_source"


def run_tags(h: Harvester) -> dict[str, str]:
    """Tags every run of the harvester carries (the concurrency limits key on them)."""
    return {HARVESTER_TAG: h.id, HOST_TAG: h.host}


def build_harvest_job(
    h: Harvester, assets: Sequence[dg.AssetsDefinition], resources: dict[str, Any]
) -> dg.JobDefinition:
    """The harvester's asset job, built from its own assets only.

    Resolving `define_asset_job` selections against the whole asset graph costs
    O(harvesters) per job, O(N^2) in all (32 s at 1000 harvesters); building each job
    from a graph of its own three assets (the source is not executable, so the job
    materializes raw_records and records) is O(1). `build_asset_job` and `AssetGraph`
    are not public API: they stay in this function, covered by the definitions tests."""
    from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
    from dagster._core.definitions.assets.job.asset_job import build_asset_job
    from dagster._core.execution.with_resources import wrap_resources_for_execution

    return build_asset_job(
        h.job_name,
        asset_graph=AssetGraph.from_assets(list(assets)),
        allow_different_partitions_defs=False,
        resource_defs=wrap_resources_for_execution(resources),
        description=f"Harvest {h.name} from {h.base_url} ({h.metadata_prefix}) into the "
        "record store: raw_records, then records.",
        tags=run_tags(h),
        executor_def=dg.in_process_executor,
    )
