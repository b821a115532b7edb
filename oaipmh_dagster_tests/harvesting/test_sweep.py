"""Sweeps that tombstone records the server did not report deleted: a reconcile's
unlisted records and the records a changed selection left behind. A sweep that would
tombstone more than the harvester's `max_delete` share of its live records stops with a
clear message and tombstones nothing unless the operator confirms
(`--allow-mass-delete`, run config `allow_mass_delete`). On SQLite and PostgreSQL,
against the loopback server with faults."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
import pytest

from oaipmh_dagster.cli import commands as cli
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.harvesting.harvest import MassDeleteHeldBack, RunOptions, harvest
from oaipmh_dagster.storage.registry import DeleteLimit, InvalidHarvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.defs.test_since import raw_meta, run_job
from oaipmh_dagster_tests.harvesting.test_reconcile import rebuilt
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

T1 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
N = 200


@pytest.fixture
def server():  # noqa: ANN201
    ds = make_dataset(N, seed=21, deleted_ratio=0.0)
    ds.deleted_record = "no"
    with OAIServer(ds, page_size=50) as srv:
        srv.clock = lambda: T1
        yield srv


def cli_run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        cli.main(list(argv))
    out = capsys.readouterr()
    return done.value.code or 0, out.out, out.err


def live(h_id: str) -> int:
    return Store().count(h_id)


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    return " ".join(str(e.event_specific_data.error.message) for e in result.all_events
                    if e.is_step_failure)


def empty_list(srv: OAIServer) -> None:
    srv.faults.add("oai_error", verb="ListIdentifiers", code="noRecordsMatch", status=200,
                   times=None)


def gone_everywhere(srv: OAIServer) -> None:
    srv.faults.add("oai_error", verb="GetRecord", code="idDoesNotExist", status=200,
                   times=None)


# -- the limit ----------------------------------------------------------------------


def test_max_delete_is_a_share_or_a_count() -> None:
    assert DeleteLimit.parse("10%").allowed(4000) == 400
    assert DeleteLimit.parse("10%").allowed(5) == 0
    assert DeleteLimit.parse("0.5%").allowed(1000) == 5
    assert DeleteLimit.parse("100%").allowed(7) == 7
    assert DeleteLimit.parse("1000").allowed(4000) == 1000
    assert DeleteLimit.parse("0").allowed(4000) == 0
    for bad in ("", "ten", "-1", "101%", "10 %", "1e3", "%", "5.123%", "12345678901"):
        with pytest.raises(InvalidHarvester, match="max_delete"):
            add_harvester("bad", "http://127.0.0.1:9/oai", max_delete=bad)


def test_max_delete_default_and_cli(database_url: str, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    code, _, err = cli_run(capsys, "harvester", "add", "lim", "--url",
                           "http://127.0.0.1:9/oai", "--prefix", "oai_dc", "--no-check")
    assert code == 0, err
    assert Registry().get("lim").max_delete == "10%"
    code, out, err = cli_run(capsys, "harvester", "show", "lim", "--json")
    assert code == 0, err and '"max_delete": "10%"' in out
    code, _, err = cli_run(capsys, "harvester", "update", "lim", "--max-delete", "1000")
    assert code == 0, err
    assert Registry().get("lim").max_delete == "1000"
    code, out, _ = cli_run(capsys, "harvester", "show", "lim")
    assert "max_delete: 1000" in out
    code, _, err = cli_run(capsys, "harvester", "update", "lim", "--max-delete", "lots")
    assert code == 2 and err.startswith("oaipmh-dagster: error: ") and "max_delete" in err
    assert Registry().get("lim").max_delete == "1000"


# -- reconcile against a broken index ---------------------------------------------------


@pytest.mark.parametrize("fault", ["empty list", "short list", "empty list, no GetRecord"])
def test_reconcile_against_a_broken_index_tombstones_nothing(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance,
        fault: str) -> None:
    h = add_harvester("broken", server.base_url)
    assert run_job(h, instance).success
    assert live("broken") == N
    before = Store().snapshot("broken")
    if fault.startswith("empty list"):
        empty_list(server)
    else:  # half the records drop out of the index: not listed, and GetRecord says gone
        server.dataset = rebuilt(server.dataset,
                                 drop={r.identifier for r in server.dataset.records[::2]})
    if fault.endswith("no GetRecord"):
        gone_everywhere(server)
    server.clear_log()
    result = run_job(h, instance, {"reconcile": True})
    assert not result.success
    text = failure_text(result)
    would = N if fault.startswith("empty") else N // 2
    assert f"would tombstone {would} of the {N} live records" in text, text
    assert "max_delete 10%" in text and "(20)" in text and "allow_mass_delete" in text
    assert Store().snapshot("broken") == before  # nothing tombstoned, nothing rewritten
    assert not [q for q in server.requests if q.verb == "GetRecord"]  # decided first
    meta = raw_meta(result)
    assert meta["oai/sweep_held_back"] is True
    assert meta["oai/sweep"] == "reconcile"
    assert (meta["oai/sweep_would_tombstone"], meta["oai/sweep_limit"]) == (would, 20)
    assert "allow_mass_delete" in meta["oai/sweep_confirm"]
    assert meta["oai/advances_since"] is False

    confirmed = run_job(h, instance, {"reconcile": True, "allow_mass_delete": True})
    assert confirmed.success
    stats = raw_meta(confirmed)
    if fault == "empty list":  # GetRecord still finds every one of them: all kept
        assert (stats["oai/reconcile_tombstoned"], stats["oai/reconcile_kept"]) == (0, N)
        assert live("broken") == N
    else:
        assert stats["oai/reconcile_tombstoned"] == would
        assert live("broken") == N - would


def test_reconcile_below_the_limit_is_unchanged(database_url: str, server: OAIServer,
                                                instance: dg.DagsterInstance) -> None:
    h = add_harvester("few", server.base_url)
    assert run_job(h, instance).success
    gone = {r.identifier for r in server.dataset.records[:20]}  # exactly 10 %
    server.dataset = rebuilt(server.dataset, drop=gone)
    result = run_job(h, instance, {"reconcile": True})
    assert result.success
    meta = raw_meta(result)
    assert meta["oai/reconcile_tombstoned"] == 20 and meta["oai/sweep_held_back"] is False
    assert live("few") == N - 20


def test_a_count_limit_and_harvest_raises(database_url: str, server: OAIServer) -> None:
    h = add_harvester("counted", server.base_url, max_delete="5")
    store = Store()
    harvest(h, store, run_id="r1")
    server.dataset = rebuilt(server.dataset,
                             drop={r.identifier for r in server.dataset.records[:6]})
    with pytest.raises(MassDeleteHeldBack, match="would tombstone 6 of the 200") as caught:
        harvest(h, store, RunOptions(reconcile=True), run_id="r2")
    assert caught.value.stats.held_back is not None
    assert store.count("counted") == N
    assert store.state("counted")["checkpoint"] is None  # the lists were complete
    stats = harvest(h, store, RunOptions(reconcile=True, allow_mass_delete=True), run_id="r3")
    assert stats.reconcile is not None and stats.reconcile.tombstoned == 6


def test_cli_holds_back_and_confirms(database_url: str, server: OAIServer,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli_run(capsys, "harvester", "add", "clim", "--url", server.base_url,
                           "--prefix", "oai_dc", "--no-check")
    assert code == 0, err
    assert cli_run(capsys, "harvest", "clim")[0] == 0
    empty_list(server)
    gone_everywhere(server)
    code, out, err = cli_run(capsys, "harvest", "clim", "--reconcile")
    assert code == 1
    error = err.splitlines()[-1]  # after the progress lines
    assert error.startswith("oaipmh-dagster: error: ") and "held back" in error, err
    err = error
    assert "would tombstone 200 of the 200 live records" in err
    assert "--allow-mass-delete" in err and "nothing was tombstoned" in err
    assert "held back" in out  # the summary says what the harvest did and held back
    assert live("clim") == N
    code, out, err = cli_run(capsys, "harvest", "clim", "--reconcile", "--allow-mass-delete")
    assert code == 0, err
    assert "200 tombstoned" in out
    assert live("clim") == 0


# -- a changed selection ----------------------------------------------------------------


def top_sets(ds) -> list[str]:  # noqa: ANN001
    return sorted({s for r in ds.records for s in r.sets if ":" not in s})


def test_a_changed_set_sweeps_the_old_selection(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance,
        capsys: pytest.CaptureFixture[str]) -> None:
    ds = server.dataset
    first, second = top_sets(ds)[:2]
    code, _, err = cli_run(capsys, "harvester", "add", "sel", "--url", server.base_url,
                           "--prefix", "oai_dc", "--set", first, "--no-check")
    assert code == 0, err
    h = Registry().get("sel")
    assert run_job(h, instance).success
    old = expected_snapshot(ds, sets=(first,))
    assert Store().snapshot("sel") == old
    code, out, err = cli_run(capsys, "harvester", "update", "sel", "--set", second,
                             "--no-check")
    assert code == 0, err
    said = [line for line in out.splitlines() if "tombstone" in line]
    assert len(said) == 1, out
    assert "next complete harvest" in said[0] and "max_delete 10%" in said[0]
    assert "--allow-mass-delete" in said[0]
    h = Registry().get("sel")

    held = run_job(h, instance)  # every old record is outside the new set: > 10 %
    assert not held.success
    assert "would tombstone" in failure_text(held)
    meta = raw_meta(held)
    assert meta["oai/sweep"] == "selection" and meta["oai/mode"] == "full"
    new = expected_snapshot(ds, sets=(second,))
    snap = Store().snapshot("sel")
    assert {k: snap[k] for k in new} == new  # the new selection's records are stored
    assert all(not snap[k][1] for k in old)  # and the old ones are still live

    swept = run_job(h, instance, {"allow_mass_delete": True})
    assert swept.success
    meta = raw_meta(swept)
    assert meta["oai/selection_swept"] == len(old)
    assert meta["oai/mode"] == "full"
    snap = Store().snapshot("sel")
    assert {k: snap[k] for k in new} == new
    assert all(snap[k][1] for k in old)  # tombstoned
    errors = {i["oai_identifier"]: i["errors"] for i in Store().iter_records("sel")}
    assert "selection" in errors[next(iter(old))][0]["message"]

    again = run_job(h, instance)  # the sweep is done: an incremental run, no sweep
    assert again.success
    meta = raw_meta(again)
    assert meta["oai/mode"] == "incremental" and "oai/selection_swept" not in meta


def test_a_changed_url_within_the_limit_sweeps_without_confirmation(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    ds = server.dataset
    keep = rebuilt(ds, drop={r.identifier for r in ds.records[:10]})  # a mirror lacking 10
    with OAIServer(keep, page_size=50) as mirror:
        mirror.clock = lambda: T1
        h = add_harvester("moved", server.base_url)
        assert run_job(h, instance).success
        from oaipmh_dagster.operations.admin import update_harvester

        change = update_harvester(Registry(), "moved", url=mirror.base_url, check=False,
                                  reload=False)
        assert any("tombstone" in line.text for line in change.lines)
        result = run_job(Registry().get("moved"), instance)
        assert result.success
        assert raw_meta(result)["oai/selection_swept"] == 10
        snap = Store().snapshot("moved")
        assert {k: snap[k] for k in expected_snapshot(keep)} == expected_snapshot(keep)
        assert all(snap[r.identifier][1] for r in ds.records[:10])


def test_a_resumed_harvest_of_the_new_selection_sweeps_on_the_next_full_run(
        database_url: str, server: OAIServer) -> None:
    ds = server.dataset
    first, second = top_sets(ds)[:2]
    h = add_harvester("res", server.base_url, sets=(first,), max_delete="100%")
    store = Store()
    harvest(h, store, run_id="r1")
    h = Registry().update("res", sets=(second,))
    server.faults.add("status", verb="ListRecords", page=2, status=500, times=None)
    with pytest.raises(Exception):  # noqa: B017, PT011 - the transport error of page 2
        harvest(h.replace(max_retries=0), store, run_id="r2")
    server.faults.clear()
    resumed = harvest(h, store, run_id="r3")
    assert resumed.mode == "resumed" and resumed.selection_swept is None
    assert resumed.sweep_pending
    old = expected_snapshot(ds, sets=(first,))
    assert all(not store.snapshot("res")[k][1] for k in old)  # not swept yet
    # The next run, from the since the resumed run recorded, is made a full one.
    full = harvest(h, store, RunOptions(since=resumed.next_since, overlap=True), run_id="r4")
    assert full.mode == "full" and full.selection_swept == len(old)
    assert all(store.snapshot("res")[k][1] for k in old)
    after = harvest(h, store, RunOptions(since=full.next_since, overlap=True), run_id="r5")
    assert after.mode == "incremental" and after.selection_swept is None


def test_an_unchanged_full_harvest_sweeps_nothing_and_rewrites_nothing(
        database_url: str, server: OAIServer) -> None:
    h = add_harvester("same", server.base_url)
    store = Store()
    harvest(h, store, run_id="r1")
    server.dataset = rebuilt(server.dataset,
                             drop={r.identifier for r in server.dataset.records[:5]})
    stats = harvest(h, store, RunOptions(full=True), run_id="r2")
    assert stats.selection_swept is None and not stats.sweep_pending
    assert stats.unchanged == N - 5
    assert {i["run_id"] for i in store.iter_records("same")} == {"r1"}
    assert store.count("same") == N  # no sweep without a changed selection


def test_migration_gives_existing_rows_the_default(database_url: str) -> None:
    import sqlalchemy as sa

    from oaipmh_dagster.storage import db

    engine = db.get_engine(database_url, migrate=False)
    assert db.upgrade(engine, "0006") == "0006"
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO oaipmh_harvester (id, name, base_url, metadata_prefix, sets, "
            "transformer, cron, timezone, enabled, comment, timeout, delay, max_parallel, "
            "max_retries, created, updated) VALUES ('old', 'Old', 'https://x.org/oai', "
            "'oai_dc', '[]', 'oai_dc', NULL, 'UTC', TRUE, '', 60, 0, 1, 5, "
            "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
        conn.execute(sa.text("INSERT INTO oaipmh_harvest_state (harvester_id, status) "
                             "VALUES ('old', 'succeeded')"))
    assert db.upgrade(engine) == db.head_revision()
    assert Registry(engine).get("old").max_delete == "10%"
    assert Store(engine).state("old")["selection"] is None  # unknown: adopted later
