"""A list that ends short of the completeListSize its first page announced is suspect: the
run keeps what it got and succeeds, but since does not advance, the log and the CLI say
why, and the asset check `complete_list_size_matches` fails. On SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

import dagster as dg
import pytest

from oaipmh_dagster.cli import commands as cli
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.demo.dataset import Dataset, make_dataset
from oaipmh_dagster.harvesting.harvest import harvest
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.defs.test_since import list_froms, raw_meta, run_job, since_of, tick
from oaipmh_dagster_tests.defs.test_ui_launches import execute_check
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer
from oaipmh_dagster_tests.oaiserver import RequestInfo

T1 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def shrunk(ds: Dataset, keep: Callable[[int], bool]) -> Dataset:
    """A copy of `ds` holding only the records whose position passes `keep`."""
    return Dataset(granularity=ds.granularity, sets=ds.sets, formats=ds.formats,
                   deleted_record="no",
                   records=[r for i, r in enumerate(ds.records) if keep(i)])


def on_list_page(server: OAIServer, page: int, change: Callable[[], None],
                 set_spec: str | None = None) -> None:
    """Call `change` once, when the server is asked for page `page` of a list (of
    `set_spec` when given)."""
    done = []

    def when(info: RequestInfo) -> bool:
        if (not done and info.verb in ("ListRecords", "ListIdentifiers") and info.page == page
                and (set_spec is None or server._decode_token(info.token).set_spec == set_spec)):
            done.append(True)
            change()
        return False

    server.faults.add("delay", when=when, seconds=0)


@pytest.fixture
def server():  # noqa: ANN201
    ds = make_dataset(40, seed=5, deleted_ratio=0.0)
    ds.deleted_record = "no"
    with OAIServer(ds, page_size=10) as srv:
        srv.clock = lambda: T1
        yield srv


def cut_to_twenty(server: OAIServer) -> None:
    """From page 3 on, the server holds only its first 20 records: the list announced 40
    on its first page and ends after 20."""
    ds = server.dataset
    on_list_page(server, 3, lambda: setattr(server, "dataset", shrunk(ds, lambda i: i < 20)))


def warnings_of(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """The warning lines of a run's log."""
    return [e.user_message for e in instance.all_logs(run_id)
            if e.level == logging.WARNING and e.user_message]


def test_short_list_keeps_records_but_not_since(database_url: str, server: OAIServer,
                                                instance: dg.DagsterInstance) -> None:
    h = add_harvester("short", server.base_url)
    cut_to_twenty(server)
    result = run_job(h, instance)
    assert result.success
    assert Store().count("short") == 20  # what it got is stored
    meta = raw_meta(result)
    assert meta["oai/advances_since"] is False
    note = meta["oai/since_note"]
    assert "20" in note and "40" in note and "completeListSize" in note, note
    assert any("ended after 20 of the 40 records" in line
               for line in warnings_of(instance, result.run_id))
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert not checks["complete_list_size_matches"].passed
    # Executed alone (the check's Execute button), it judges that harvest the same way.
    _, raw_key, _ = asset_keys("short")
    alone = execute_check(h, instance, dg.AssetCheckKey(raw_key, "complete_list_size_matches"))
    (evaluation,) = alone.get_asset_check_evaluations()
    assert not evaluation.passed
    assert evaluation.metadata["short_lists"].value == checks[
        "complete_list_size_matches"].metadata["short_lists"].value
    # The next run asks again from the old since: none, so in full.
    tick(instance, None, h)
    assert since_of(instance, h) is None
    server.clear_log()
    second = run_job(h, instance)
    assert second.success and list_froms(server) == [None]
    assert raw_meta(second)["oai/advances_since"] is True
    checks = {c.check_name: c for c in second.get_asset_check_evaluations()}
    assert checks["complete_list_size_matches"].passed


def test_short_list_of_one_set_is_named(database_url: str, instance: dg.DagsterInstance) -> None:
    ds = make_dataset(120, seed=9, sets=4, deleted_ratio=0.0)
    specs = sorted({s for r in ds.records for s in r.sets if ":" not in s})[:2]
    with OAIServer(ds, page_size=10) as srv:
        srv.clock = lambda: T1
        h = add_harvester("sets2", srv.base_url, sets=tuple(specs))
        first = [r.identifier for r in ds.records if r.in_set(specs[1])][:15]
        on_list_page(srv, 2, lambda: setattr(
            srv, "dataset", shrunk(ds, lambda i: not ds.records[i].in_set(specs[1])
                                   or ds.records[i].identifier in first)), set_spec=specs[1])
        result = run_job(h, instance)
    assert result.success
    meta = raw_meta(result)
    assert meta["oai/advances_since"] is False
    assert f"set {specs[1]}" in meta["oai/since_note"]
    assert f"set {specs[0]}" not in meta["oai/since_note"]


def test_complete_list_advances_and_check_passes_on_incremental(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    h = add_harvester("whole", server.base_url)
    result = run_job(h, instance, {"since": "2019-01-01"})
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["complete_list_size_matches"].passed
    assert "completeListSize" not in raw_meta(result)["oai/since_note"]


def test_windowed_lists_are_not_judged(database_url: str, server: OAIServer) -> None:
    """A window's completeListSize counts only that window: no window is 'short'."""
    h = add_harvester("win", server.base_url, max_parallel=3)
    stats = harvest(h, Store(), run_id="r1")
    assert stats.short_lists == [] and stats.covers_selection


def test_cli_summary_says_since_did_not_advance(database_url: str, server: OAIServer,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    add_harvester("clishort", server.base_url)
    cut_to_twenty(server)
    with pytest.raises(SystemExit) as done:
        cli.main(["harvest", "clishort"])
    out = capsys.readouterr().out
    assert done.value.code in (0, None)
    assert "ended after 20 of the 40 records" in out and "since not advanced" in out, out
