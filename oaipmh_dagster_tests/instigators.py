"""Sensor and schedule states stored the way Dagster's daemon stores them (Dagster's
instigator storage is not public API: tests reach it only through here)."""

from __future__ import annotations

import dagster as dg
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    LoadableTargetOrigin,
    RemoteInstigatorOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.scheduler.instigation import (
    InstigatorState,
    InstigatorStatus,
    InstigatorType,
    ScheduleInstigatorData,
    SensorInstigatorData,
)


def _origin(name: str, location: str) -> RemoteInstigatorOrigin:
    return RemoteInstigatorOrigin(RemoteRepositoryOrigin(InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="oaipmh_dagster.definitions"),
        location_name=location), "__repository__"), name)


def start_sensor(instance: dg.DagsterInstance, name: str, location: str,
                 cursor: str | None) -> None:
    """A RUNNING sensor of `location` with `cursor` stored."""
    instance.add_instigator_state(InstigatorState(
        _origin(name, location), InstigatorType.SENSOR, InstigatorStatus.RUNNING,
        SensorInstigatorData(cursor=cursor)))


def start_schedule(instance: dg.DagsterInstance, name: str, location: str, cron: str) -> None:
    """A RUNNING schedule of `location`."""
    instance.add_instigator_state(InstigatorState(
        _origin(name, location), InstigatorType.SCHEDULE, InstigatorStatus.RUNNING,
        ScheduleInstigatorData(cron, start_timestamp=None)))


def stop_schedule(instance: dg.DagsterInstance, name: str, location: str, cron: str) -> None:
    """A schedule of `location` stopped in the UI (a STOPPED state stored)."""
    instance.add_instigator_state(InstigatorState(
        _origin(name, location), InstigatorType.SCHEDULE, InstigatorStatus.STOPPED,
        ScheduleInstigatorData(cron, start_timestamp=None)))


def schedule_states(instance: dg.DagsterInstance) -> dict[tuple[str, str], str]:
    """(schedule name, location) -> stored status."""
    return {(s.name, s.origin.repository_origin.code_location_origin.location_name):
            s.status.value
            for s in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE)}
