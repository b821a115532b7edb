"""The job `harvest_oaipmh_records_<id>` of each harvester."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from oaipmh_dagster.contracts import HARVESTER_TAG, HOST_TAG, SINCE_SOURCE_TAG, SINCE_TAG
from oaipmh_dagster.dagster_parts._private import build_job
from oaipmh_dagster.registry import Harvester

__all__ = ["HARVESTER_TAG", "HOST_TAG", "SINCE_SOURCE_TAG", "SINCE_TAG", "build_harvest_job",
           "run_tags"]


def run_tags(h: Harvester) -> dict[str, str]:
    """Tags every run of the harvester carries (the concurrency limits key on them)."""
    return {HARVESTER_TAG: h.id, HOST_TAG: h.host}


def build_harvest_job(
    h: Harvester, assets: Sequence[dg.AssetsDefinition], resources: Mapping[str, Any]
) -> dg.JobDefinition:
    """The harvester's asset job, built from its own assets only (the source is not
    executable, so the job materializes raw_records and records): O(1) per harvester,
    where resolving `define_asset_job` selections against the whole asset graph is
    O(harvesters) per job."""
    return build_job(
        h.job_name, list(assets), resources,
        description=f"Harvest {h.name} from {h.base_url} ({h.metadata_prefix}) into the "
        "record store: raw_records, then records.",
        tags=run_tags(h),
    )
