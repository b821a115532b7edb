"""Changing the number of shards without losing a schedule's on/off.

Dagster keys a schedule's stored state (switched on or off in the UI) by its code
location. Location names do not carry K (`shards`), so a harvester that stays in its
location keeps its state. A harvester that moves gets a schedule in a location where
no state is stored: its default status applies, which is the registry's `enabled`. So
`reshard` first copies the state of each schedule about to move into `enabled`, then
deletes every state a location that will not hold the harvester still stores (were one
kept, it would come back into force if the harvester moved back there one day), and
stores the new K last."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from oaipmh_dagster.defs import _private
from oaipmh_dagster.operations.shards import (
    InvalidShard,
    Shard,
    location_names,
    parse_location,
    shard_of,
)
from oaipmh_dagster.storage.registry import SHARDS_SETTING, Harvester, Registry

__all__ = ["Reshard", "reshard"]

_SHARD_SUFFIX = re.compile(r"([_-])shard\1\d+(\1of\1\d+)?")


@dataclass
class Reshard:
    """What a re-shard did: schedule states copied into the registry, states deleted."""

    old_count: int | None
    count: int
    carried: list[str] = field(default_factory=list)  # "<id>: on|off (from <location>)"
    forgotten: int = 0


def _of_prefix(location: str, prefix: str) -> bool:
    """Whether `location` is one of this deployment's names (`prefix`, or a shard of it)."""
    return location == prefix or (location.startswith(prefix)
                                  and _SHARD_SUFFIX.fullmatch(location[len(prefix):]) is not None)


def _holder(old_count: int | None) -> Callable[[str, str], bool]:
    """Whether a location holds a harvester under the configuration in force (the
    stored K; a name that carries K, its own)."""

    def holds(location: str, harvester_id: str) -> bool:
        parsed = parse_location(location)
        if parsed is None:
            return old_count in (None, 1)
        try:
            shard = Shard.of_location(location, old_count)
        except InvalidShard:
            return False
        return shard is not None and shard.holds(harvester_id)

    return holds


def reshard(instance: dg.DagsterInstance, registry: Registry, count: int,
            prefix: str) -> Reshard:
    """Store K = `count` for the locations named after `prefix`, carrying over every
    schedule state that K leaves in a location no longer holding its harvester."""
    done = Reshard(registry.shard_count(), count)
    holds = _holder(done.old_count)
    names = location_names(count, prefix)
    by_job: dict[str, Harvester] = {h.job_name: h for h in registry.list()}
    for stored in _private.stored_schedules(instance):
        h = by_job.get(stored.name)
        if h is None or not _of_prefix(stored.location, prefix):
            continue
        live = holds(stored.location, h.id)
        if live and stored.location == names[shard_of(h.id, count)]:
            continue  # it stays where it is, and so does its state
        if live:
            if h.enabled != stored.running:
                registry.update(h.id, enabled=stored.running)
            done.carried.append(f"{h.id}: {'on' if stored.running else 'off'} "
                                f"(from {stored.location})")
        _private.forget_schedule(instance, stored)
        done.forgotten += 1
    registry.set_setting(SHARDS_SETTING, str(count))
    return done
