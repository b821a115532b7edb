"""One schedule per harvester, named like its job; each tick carries the resolved since."""

from __future__ import annotations

import dagster as dg

from oaipmh_dagster.dagster_parts.assets import asset_keys, op_name
from oaipmh_dagster.dagster_parts.jobs import run_tags
from oaipmh_dagster.dagster_parts.since import resolve_since
from oaipmh_dagster.registry import Harvester

# A harvester without cron still gets a (stopped) schedule; started, it ticks once a
# year and skips, so it never launches anything.
NO_CRON = "0 0 1 1 *"


def build_schedule(
    h: Harvester, job: dg.JobDefinition, location_name: str | None = None
) -> dg.ScheduleDefinition:
    """The schedule `harvest_oaipmh_records_<id>` (RUNNING by default when enabled)."""
    _, raw_key, _ = asset_keys(h.id)

    def evaluate(context: dg.ScheduleEvaluationContext):  # noqa: ANN202 - Dagster union
        if h.cron is None:
            return dg.SkipReason(f"harvester {h.id} has no cron expression: nothing to run")
        resolved = resolve_since(context.instance, h.id, since=None, full=False,
                                 raw_asset_key=raw_key, location_name=location_name)
        config = {"since": resolved.value, "full": resolved.value is None}
        scheduled = context.scheduled_execution_time
        return dg.RunRequest(
            run_key=scheduled.isoformat() if scheduled else None,
            run_config={"ops": {op_name(h.id): {"config": config}}},
            tags={**run_tags(h), "oaipmh/since": resolved.value or "full",
                  "oaipmh/since_source": resolved.source},
        )

    return dg.ScheduleDefinition(
        name=h.job_name,
        job=job,
        cron_schedule=h.cron or NO_CRON,
        execution_timezone=h.timezone,
        execution_fn=evaluate,
        default_status=(
            dg.DefaultScheduleStatus.RUNNING if h.enabled and h.cron
            else dg.DefaultScheduleStatus.STOPPED
        ),
        description=(
            f"Incremental harvest of {h.name} ({h.cron} {h.timezone}); each run's config "
            "carries the since it harvests from."
            if h.cron else f"{h.name} has no cron: this schedule never launches a run."
        ),
    )
