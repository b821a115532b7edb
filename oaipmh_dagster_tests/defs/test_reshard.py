"""Re-sharding keeps every schedule's on/off: a harvester that stays keeps its stored
state (its location keeps its name), one that moves takes it along through the
registry's `enabled`, and no state is left behind to come back later."""

from __future__ import annotations

import dagster as dg
import pytest

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs.reshard import reshard
from oaipmh_dagster.operations.shards import Shard, shard_of
from oaipmh_dagster.storage.registry import Registry
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.instigators import schedule_states, start_schedule, stop_schedule

IDS = [f"h{i:03d}" for i in range(60)]
CRON = "0 3 * * *"


def _pick(old: int, new: int, moves: bool, skip: tuple[str, ...] = ()) -> str:
    return next(h for h in IDS if (shard_of(h, old) != shard_of(h, new)) is moves
                and h not in skip)


def _location(hid: str, count: int) -> str:
    return Shard(shard_of(hid, count), count).location_name()


def _default_running(registry: Registry, hid: str) -> bool:
    """The schedule's default status in the location built from the registry row."""
    defs = build_definitions([registry.get(hid)])
    schedule = defs.get_repository_def().get_schedule_def(f"harvest_oaipmh_records_{hid}")
    return schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_a_reshard_keeps_every_toggled_schedule(database_url: str) -> None:
    registry = Registry()
    off_moves = _pick(2, 3, True)
    on_moves = _pick(2, 3, True, (off_moves,))
    off_stays = _pick(2, 3, False)
    for hid, enabled in ((off_moves, True), (on_moves, False), (off_stays, True)):
        add_harvester(hid, "http://127.0.0.1:9/oai", cron=CRON, enabled=enabled)
    registry.set_setting("shards", "2")
    with dg.DagsterInstance.get() as instance:
        # Switched in the UI against their registry defaults.
        stop_schedule(instance, f"harvest_oaipmh_records_{off_moves}",
                      _location(off_moves, 2), CRON)
        start_schedule(instance, f"harvest_oaipmh_records_{on_moves}",
                       _location(on_moves, 2), CRON)
        stop_schedule(instance, f"harvest_oaipmh_records_{off_stays}",
                      _location(off_stays, 2), CRON)
        # A state left in a location that does not hold the harvester (stale).
        start_schedule(instance, f"harvest_oaipmh_records_{off_stays}",
                       "oaipmh_dagster_shard_9", CRON)
        # Another deployment's location: not ours to touch.
        start_schedule(instance, f"harvest_oaipmh_records_{off_moves}", "elsewhere", CRON)
        done = reshard(instance, registry, 3, "oaipmh_dagster")
        states = schedule_states(instance)
    assert registry.shard_count() == 3 and done.old_count == 2
    assert done.forgotten == 3 and len(done.carried) == 2
    # Moved: no state in the new location, the registry default says what the UI said.
    assert _location(off_moves, 3) != _location(off_moves, 2)
    assert not _default_running(registry, off_moves)
    assert _default_running(registry, on_moves)
    assert (f"harvest_oaipmh_records_{off_moves}", _location(off_moves, 2)) not in states
    assert (f"harvest_oaipmh_records_{on_moves}", _location(on_moves, 2)) not in states
    # Stayed: its state stays, under the same location name; the stale one is gone.
    assert states == {
        (f"harvest_oaipmh_records_{off_stays}", _location(off_stays, 3)): "STOPPED",
        (f"harvest_oaipmh_records_{off_moves}", "elsewhere"): "RUNNING"}
    assert registry.get(off_stays).enabled  # its stored state rules, not the registry


def test_names_of_earlier_versions_hand_their_states_over(sqlite_url: str) -> None:
    """Migrating from `..._shard_<i>_of_<K>` names: every location gets a new name, so
    every toggled state goes through the registry."""
    registry = Registry()
    hid = IDS[0]
    add_harvester(hid, "http://127.0.0.1:9/oai", cron=CRON, enabled=True)
    with dg.DagsterInstance.get() as instance:
        stop_schedule(instance, f"harvest_oaipmh_records_{hid}",
                      f"oaipmh_dagster_shard_{shard_of(hid, 4)}_of_4", CRON)
        # The same schedule in a location of the old K that did not hold it: stale.
        other = (shard_of(hid, 4) + 1) % 4
        start_schedule(instance, f"harvest_oaipmh_records_{hid}",
                       f"oaipmh_dagster_shard_{other}_of_4", CRON)
        done = reshard(instance, registry, 4, "oaipmh_dagster")
        assert schedule_states(instance) == {}
    assert done.old_count is None and done.forgotten == 2
    assert registry.get(hid).enabled is False


@pytest.mark.parametrize("count", [1, 2])
def test_a_reshard_with_nothing_stored_only_stores_the_count(sqlite_url: str,
                                                             count: int) -> None:
    registry = Registry()
    add_harvester(IDS[0], "http://127.0.0.1:9/oai", cron=CRON)
    with dg.DagsterInstance.get() as instance:
        done = reshard(instance, registry, count, "oaipmh_dagster")
    assert (done.carried, done.forgotten, registry.shard_count()) == ([], 0, count)
