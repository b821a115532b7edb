"""One schedule per harvester, named like its job. A tick launches a run unless the
harvester already has one queued or in progress. The op resolves since when the run
starts; the tick reads the since in force only to tag the run `oaipmh/mode: full` or
`incremental`, so the run queue can hold back first harvests without delaying the
daily incrementals."""

from __future__ import annotations

import dagster as dg

from oaipmh_dagster.contracts import HARVESTER_TAG, MODE_TAG
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.defs.jobs import run_tags
from oaipmh_dagster.defs.since import run_mode
from oaipmh_dagster.storage.registry import Harvester

# A harvester without cron still gets a (stopped) schedule; started, it ticks once a
# year and skips, so it never launches anything.
NO_CRON = "0 0 1 1 *"


IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
]


def active_run(instance: dg.DagsterInstance, harvester_id: str) -> str | None:
    """The id of a queued or running run of the harvester's job, if any."""
    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={HARVESTER_TAG: harvester_id}, statuses=IN_PROGRESS),
        limit=1,
    )
    return records[0].dagster_run.run_id if records else None


def build_schedule(h: Harvester, job: dg.JobDefinition) -> dg.ScheduleDefinition:
    """The schedule `harvest_oaipmh_records_<id>` (RUNNING by default when enabled)."""

    def evaluate(context: dg.ScheduleEvaluationContext):  # noqa: ANN202 - Dagster union
        if h.cron is None:
            return dg.SkipReason(f"harvester {h.id} has no cron expression: nothing to run")
        busy = active_run(context.instance, h.id)
        if busy is not None:
            return dg.SkipReason(f"harvester {h.id} already has run {busy} queued or in "
                                 "progress: this tick adds no other")
        scheduled = context.scheduled_execution_time
        return dg.RunRequest(
            run_key=scheduled.isoformat() if scheduled else None,
            tags={**run_tags(h), MODE_TAG: run_mode(context.instance, h, asset_keys(h.id)[1])},
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
            f"Incremental harvest of {h.name} ({h.cron} {h.timezone}); each run resolves "
            "its since when it starts (its tags show the value and its source) and is "
            "tagged oaipmh/mode: full when no since is in force at the tick."
            if h.cron else f"{h.name} has no cron: this schedule never launches a run."
        ),
    )
