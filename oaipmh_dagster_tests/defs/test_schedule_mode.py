"""The schedule tags each run with the mode the since in force gives at tick time, so
the run queue can limit first (full) harvests apart from the daily incrementals."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg

from oaipmh_dagster.contracts import MODE_TAG
from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.defs.since import set_since
from oaipmh_dagster.storage.registry import Harvester


def _tags(instance: dg.DagsterInstance, h: Harvester) -> dict[str, str]:
    schedule = build_definitions([h]).get_repository_def().get_schedule_def(h.job_name)
    ctx = dg.build_schedule_context(instance=instance,
                                    scheduled_execution_time=datetime(2026, 1, 1, tzinfo=UTC))
    requests = schedule.evaluate_tick(ctx).run_requests
    assert requests is not None and len(requests) == 1
    return dict(requests[0].tags)


def test_the_schedule_tags_full_then_incremental(instance: dg.DagsterInstance) -> None:
    h = Harvester(id="big", base_url="http://127.0.0.1:9/oai", metadata_prefix="oai_dc",
                  cron="17 3 * * *")
    tags = _tags(instance, h)
    assert tags[MODE_TAG] == "full"  # nothing harvested yet
    assert tags["oaipmh/harvester"] == "big"
    set_since(instance, h, asset_keys(h.id)[1], "2026-01-01")
    assert _tags(instance, h)[MODE_TAG] == "incremental"
    # Another selection: the since in force says nothing about it, the run is full.
    other = Harvester(id="big", base_url="http://127.0.0.1:9/oai", metadata_prefix="datacite",
                      cron="17 3 * * *")
    assert _tags(instance, other)[MODE_TAG] == "full"
    set_since(instance, h, asset_keys(h.id)[1], None)  # reset: a full harvest next
    assert _tags(instance, h)[MODE_TAG] == "full"
