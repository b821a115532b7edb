"""Importing many harvesters (`bulk`): every row checked before anything is written,
row numbers in the refusals, ids given twice, --update, one probe per endpoint, one
transaction, one reload per shard (a counting fake of the reload)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.operations.bulk import plan_import, shard_groups, write_import
from oaipmh_dagster.operations.harvester_files import Row
from oaipmh_dagster.operations.shards import shard_of
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import (
    SHARDS_SETTING,
    Harvester,
    HarvesterExists,
    Registry,
)
from oaipmh_dagster_tests.helpers import add_harvester

URL = "http://127.0.0.1:9/oai"


@pytest.fixture(scope="module")
def server() -> Iterator[OAIServer]:
    srv = OAIServer(make_dataset(5, seed=3, sets=3), page_size=5).start()
    yield srv
    srv.stop()


def rows(*items: dict[str, Any]) -> list[Row]:
    return [Row(n, f"row {n}", item) for n, item in enumerate(items, 1)]


def one(hid: str, **fields: Any) -> dict[str, Any]:
    return {"id": hid, "url": URL, "prefix": "oai_dc", **fields}


def registered() -> list[Harvester]:
    return Registry(db.get_engine()).list()


def test_every_row_is_checked_before_anything_is_written(sqlite_url: str) -> None:
    registry = Registry(db.get_engine())
    plan = plan_import(registry, rows(
        one("good"), one("Bad-Id"), one("late", cron="not a cron"),
        one("fine", timeout=0), {"url": URL}, one("two", sets="a")), check=False)
    assert [str(b) for b in plan.bad] == [
        "row 2 (Bad-Id): invalid harvester id 'Bad-Id': use 1-48 characters a-z, 0-9 and _, "
        "starting with a letter or digit",
        "row 3 (late): invalid cron expression 'not a cron'",
        "row 4 (fine): timeout must be in (0, 3600] seconds, not 0.0",
        "row 5: no id",
        "row 6 (two): sets must be a list of set specs, not 'a'"]
    assert plan.usage and [h.id for h in plan.new] == ["good"]
    assert registered() == []  # planning writes nothing


def test_ids_given_twice_are_bad_rows_everywhere(sqlite_url: str) -> None:
    plan = plan_import(Registry(db.get_engine()),
                       rows(one("a"), one("b"), one("a", cron="0 3 * * *")), check=False)
    assert [str(b) for b in plan.bad] == [
        "row 1 (a): id 'a' is given more than once (row 1, row 3)",
        "row 3 (a): id 'a' is given more than once (row 1, row 3)"]
    assert [h.id for h in plan.new] == ["b"]


def test_an_existing_id_needs_update(sqlite_url: str, reloads: list) -> None:
    add_harvester("old", URL, name="Kept", cron="0 1 * * *", max_retries=2)
    registry = Registry(db.get_engine())
    plan = plan_import(registry, rows(one("old", cron="0 2 * * *")), check=False)
    assert [str(b) for b in plan.bad] == [
        "row 1 (old): harvester 'old' already exists (--update changes it)"]
    plan = plan_import(registry, rows(one("old", cron="0 2 * * *"), one("new")),
                       update=True, check=False)
    assert plan.bad == [] and [h.id for h in plan.new] == ["new"]
    ((stored, wanted),) = plan.changed
    # A field the row leaves out keeps its stored value (max_retries, name).
    assert (wanted.cron, wanted.max_retries, wanted.name) == ("0 2 * * *", 2, "Kept")
    done = write_import(registry, plan)
    assert [line.text for line in done.lines][:2] == [
        f"added harvester new: {URL} (oai_dc)", "updated harvester old: cron"]
    h = registry.get("old")
    assert (h.cron, h.max_retries, h.name) == ("0 2 * * *", 2, "Kept")
    again = plan_import(registry, rows(one("old", cron="0 2 * * *")), update=True,
                        check=False)
    assert again.unchanged == ["old"] and again.changed == [] and again.new == []


def test_a_changed_selection_forgets_the_harvest_state(sqlite_url: str,
                                                       reloads: list) -> None:
    from oaipmh_dagster.storage import open_store

    add_harvester("old", URL, sets=("a",))
    registry = Registry(db.get_engine())
    plan = plan_import(registry, rows(one("old", sets=["b"])), update=True, check=False)
    seen: list[str] = []
    store = open_store(registry.engine)
    original = type(store).selection_changed

    def spy(self: Any, harvester_id: str, scope: Any) -> None:
        seen.append(harvester_id)
        original(self, harvester_id, scope)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(store), "selection_changed", spy)
        done = write_import(registry, plan)
    assert seen == ["old"]
    assert "old: the URL, prefix or sets changed: the next harvest is a full one" in [
        line.text for line in done.lines]


def test_the_write_is_one_transaction(sqlite_url: str, reloads: list) -> None:
    """An id taken between the plan and the write (another add) refuses every row."""
    registry = Registry(db.get_engine())
    plan = plan_import(registry, rows(one("a"), one("b"), one("c")), check=False)
    add_harvester("c", URL)
    with pytest.raises(Exception) as refused:  # noqa: PT011 - AdminError, checked below
        write_import(registry, plan)
    assert "added meanwhile: nothing written" in str(refused.value)
    assert [h.id for h in registered()] == ["c"]
    assert reloads == []
    with pytest.raises(HarvesterExists):
        registry.write_many([Harvester(id="d", base_url=URL, metadata_prefix="oai_dc"),
                             Harvester(id="c", base_url=URL, metadata_prefix="oai_dc")], [])
    assert [h.id for h in registered()] == ["c"]


def test_one_reload_per_shard(sqlite_url: str, reloads: list) -> None:
    registry = Registry(db.get_engine())
    registry.set_setting(SHARDS_SETTING, "3")
    ids = [f"h{i:02d}" for i in range(20)]
    plan = plan_import(registry, rows(*(one(i) for i in ids)), check=False)
    done = write_import(registry, plan, locate=lambda hid: f"loc_{shard_of(hid, 3)}")
    shards = sorted({shard_of(i, 3) for i in ids})
    assert len(shards) == 3  # the ids fill every shard: 20 rows, 3 reloads
    assert done.reloads == len(reloads) == 3
    assert [shard_of(call["harvester_id"], 3) for call in reloads] == shards
    assert [call["location"] for call in reloads] == [f"loc_{s}" for s in shards]
    # An unchanged re-import reloads nothing; a change to one harvester reloads its shard.
    plan = plan_import(registry, rows(*(one(i) for i in ids)), update=True, check=False)
    assert write_import(registry, plan).reloads == 0
    plan = plan_import(registry, rows(one("h07", cron="0 5 * * *")), update=True,
                       check=False)
    assert write_import(registry, plan).reloads == 1
    assert reloads[-1]["harvester_id"] == "h07"


def test_without_a_stored_shard_count_one_reload(sqlite_url: str, reloads: list) -> None:
    registry = Registry(db.get_engine())
    plan = plan_import(registry, rows(*(one(f"x{i}") for i in range(5))), check=False)
    assert write_import(registry, plan).reloads == 1 and len(reloads) == 1
    assert shard_groups(["a", "b"], 1) == [["a", "b"]]


def test_each_endpoint_is_probed_once(sqlite_url: str, server: OAIServer) -> None:
    sets = sorted(server.dataset.sets)
    server.clear_log()
    registry = Registry(db.get_engine())
    seen: list[tuple[int, int]] = []
    plan = plan_import(registry, rows(
        one("a", url=server.base_url, sets=[sets[0]]),
        one("b", url=server.base_url, sets=[sets[1]]),
        one("c", url=server.base_url, prefix="marc21"),
        one("d", url=server.base_url, sets=["nosuch"]),
        one("e", url=server.base_url, name="Mine")), progress=lambda *p: seen.append(p))
    verbs = [entry.verb for entry in server.settled()]
    assert verbs.count("Identify") == 1 and verbs.count("ListMetadataFormats") == 1
    assert seen == [(1, 1)]
    assert [(b.label, b.usage) for b in plan.bad] == [("row 3", True), ("row 4", False)]
    assert "does not offer metadataPrefix 'marc21'" in plan.bad[0].message
    assert "does not list set 'nosuch'" in plan.bad[1].message
    names = {h.id: h.name for h in plan.new}
    assert names == {"a": "Demo Research Repository", "b": "Demo Research Repository",
                     "e": "Mine"}


def test_an_unreachable_endpoint_refuses_its_rows(sqlite_url: str,
                                                  closed_port_url: str) -> None:
    plan = plan_import(Registry(db.get_engine()),
                       rows(one("a", url=closed_port_url, timeout=5.0),
                            one("b", url=closed_port_url, timeout=5.0, sets=["x"])),
                       check=True)
    assert [b.label for b in plan.bad] == ["row 1", "row 2"] and not plan.usage
    assert f"cannot use {closed_port_url} as an OAI-PMH endpoint" in plan.bad[0].message


def test_an_unchanged_selection_is_not_probed(sqlite_url: str, reloads: list,
                                              closed_port_url: str) -> None:
    """As `harvester update`: only a new or changed URL, prefix or sets is probed."""
    add_harvester("old", closed_port_url)
    plan = plan_import(Registry(db.get_engine()),
                       rows(one("old", url=closed_port_url, cron="0 3 * * *")),
                       update=True, check=True)
    assert plan.bad == [] and len(plan.changed) == 1


def test_ids_read_as_numbers_are_compared_as_text(sqlite_url: str) -> None:
    plan = plan_import(Registry(db.get_engine()),
                       rows(one("2024"), {**one("x"), "id": 2024}), check=False)
    assert [str(b) for b in plan.bad] == [
        "row 1 (2024): id '2024' is given more than once (row 1, row 2)",
        "row 2 (2024): id '2024' is given more than once (row 1, row 2)"]


def test_an_update_row_changes_only_what_it_names(sqlite_url: str, reloads: list) -> None:
    """`--update` with a partial file (`id,cron`): the columns left out keep their stored
    values (even url and prefix, which a new row needs); an empty cell is the default."""
    add_harvester("old", URL, name="Kept", cron="0 1 * * *", max_retries=2, delay=1.5)
    registry = Registry(db.get_engine())
    plan = plan_import(registry, [Row(1, "row 1", {"id": "old", "cron": "0 3 * * *"}),
                                  Row(2, "row 2", {"id": "old2", "cron": "0 3 * * *"})],
                       update=True, check=False)
    assert [b.harvester_id for b in plan.bad] == ["old2"]  # new: needs url and prefix
    ((_, wanted),) = plan.changed
    assert (wanted.base_url, wanted.cron, wanted.max_retries, wanted.delay, wanted.name) == (
        URL, "0 3 * * *", 2, 1.5, "Kept")
    csv_row = Row(1, "row 1 (line 2)", {"id": "old", "cron": "0 4 * * *", "delay": ""},
                  text=True)
    ((_, wanted),) = plan_import(registry, [csv_row], update=True, check=False).changed
    assert (wanted.cron, wanted.max_retries, wanted.delay) == ("0 4 * * *", 2, 0.0)
