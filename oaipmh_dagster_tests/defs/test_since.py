"""Incremental state that is never silently wrong: a since belongs to the selection that
produced it, only runs that covered that selection advance it, resumed lists keep their
start, untrusted clocks are not believed, every Dagster path is governed alike, and
operators can see and steer it. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs import sensors
from oaipmh_dagster.defs import since as since_mod
from oaipmh_dagster.defs.assets import asset_keys, op_name
from oaipmh_dagster.defs.since import (
    SENSOR_NAME,
    current_state,
    resolve_since,
    set_since,
)
from oaipmh_dagster.demo.dataset import ServedRecord, make_dataset
from oaipmh_dagster.harvesting import incremental
from oaipmh_dagster.oai import Granularity
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.instigators import start_sensor
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

LOCATION = "oaipmh_dagster"
T1 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
DC = {"oai_dc": "<oai_dc:dc xmlns:oai_dc='http://www.openarchives.org/OAI/2.0/oai_dc/'/>"}


@pytest.fixture
def server():  # noqa: ANN201
    ds = make_dataset(600, seed=3)
    with OAIServer(ds, page_size=100) as srv:
        srv.clock = lambda: T1
        yield srv


def run_job(h: Harvester, instance: dg.DagsterInstance, config: dict | None = None,
            selection: list[dg.AssetKey] | None = None) -> dg.ExecuteInProcessResult:
    job = build_definitions([h], LOCATION).resolve_job_def(h.job_name)
    return job.execute_in_process(run_config={"ops": {op_name(h.id): {"config": config or {}}}},
                                  instance=instance, asset_selection=selection,
                                  raise_on_error=False)


def tick(instance: dg.DagsterInstance, cursor: str | None, *hs: Harvester,
         location: str = LOCATION) -> sensors.Tick:
    """One evaluation of the since sensor, its observations reported as the daemon does."""
    result = sensors.evaluate(instance, cursor, list(hs), location)
    sensors.report(instance, result)
    return result


def raw_meta(result: dg.ExecuteInProcessResult) -> dict:
    mats = [m.materialization for m in result.get_asset_materialization_events()
            if m.asset_key.path[-1] == "raw_records"]
    assert len(mats) == 1
    return {k: v.value for k, v in mats[0].metadata.items()}


def list_froms(srv: OAIServer) -> list[str | None]:
    """`from` of each list the server was asked to start (token requests excluded)."""
    return [(r.params.get("from") or [None])[0] for r in srv.requests
            if r.verb == "ListRecords" and "resumptionToken" not in r.params]


def since_of(instance: dg.DagsterInstance, h: Harvester) -> str | None:
    return resolve_since(instance, h, since=None, full=False, raw_key=asset_keys(h.id)[1]).value


def fresh(h_id: str) -> Harvester:
    return Registry().get(h_id)


# -- 1. identity ---------------------------------------------------------------------


def test_changed_sets_url_or_prefix_harvest_in_full(database_url: str, server: OAIServer,
                                                     instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url, sets=("datasets",))
    assert run_job(h, instance).success
    tick(instance, None, h)
    assert since_of(instance, h) == "2026-03-01T12:00:00Z"
    for changes in ({"sets": ("theses",)}, {"metadata_prefix": "datacite"},
                    {"base_url": server.base_url + "?"}):
        Registry().update("j", **changes)
        h = fresh("j")
        resolved = resolve_since(instance, h, since=None, full=False,
                                 raw_key=asset_keys("j")[1])
        assert (resolved.value, resolved.source) == (None, "scope_changed"), changes
        assert "another URL, prefix or sets" in resolved.note
    Registry().update("j", base_url=server.base_url, metadata_prefix="oai_dc",
                      sets=("theses",))
    h = fresh("j")
    server.clear_log()
    # The datasets records left the selection: their sweep (test_sweep.py) is confirmed.
    result = run_job(h, instance, {"allow_mass_delete": True})
    assert result.success
    assert list_froms(server) == [None]  # the new set's whole backlog
    meta = raw_meta(result)
    assert meta["oai/since_source"] == "scope_changed" and meta["oai/advances_since"]
    assert meta["oai/selection_swept"] > 0
    tick(instance, None, h)
    assert since_of(instance, h) == "2026-03-01T12:00:00Z"  # now for the new selection
    assert Store().snapshot("j").keys() >= expected_snapshot(server.dataset,
                                                             sets=("theses",)).keys()


# -- 2. only a run over the whole selection advances since -----------------------------


@pytest.mark.parametrize("config, why", [
    ({"sets": ["datasets"]}, "other sets"),
    ({"until": "2030-01-01"}, "until"),
    ({"oai_ids": ["oai:demo.example.org:1"]}, "chosen identifiers"),
    ({"since": "2025-06-01"}, "after the harvester's since"),
])
def test_partial_runs_do_not_advance_since(database_url: str, server: OAIServer,
                                           instance: dg.DagsterInstance, config: dict,
                                           why: str) -> None:
    h = add_harvester("j", server.base_url, sets=("datasets", "theses"))
    server.clock = lambda: datetime(2025, 1, 1, tzinfo=UTC)
    assert run_job(h, instance).success
    tick(instance, None, h)
    assert since_of(instance, h) == "2025-01-01T00:00:00Z"
    server.clock = lambda: T1
    result = run_job(h, instance, config)
    assert result.success
    meta = raw_meta(result)
    assert meta["oai/advances_since"] is False
    assert why in meta["oai/since_note"]
    tick(instance, None, h)
    assert since_of(instance, h) == "2025-01-01T00:00:00Z"


def test_explicit_since_before_the_stored_one_advances(database_url: str, server: OAIServer,
                                                        instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    server.clock = lambda: datetime(2025, 1, 1, tzinfo=UTC)
    assert run_job(h, instance).success
    server.clock = lambda: T1
    result = run_job(h, instance, {"since": "2024-06-01"})
    assert raw_meta(result)["oai/advances_since"] is True
    tick(instance, None, h)
    assert since_of(instance, h) == "2026-03-01T12:00:00Z"


def test_explicit_since_without_a_stored_one_does_not_advance(
    database_url: str, server: OAIServer, instance: dg.DagsterInstance
) -> None:
    h = add_harvester("j", server.base_url)
    result = run_job(h, instance, {"since": "2024-06-01"})
    assert result.success and raw_meta(result)["oai/advances_since"] is False
    tick(instance, None, h)
    assert since_of(instance, h) is None


# -- 3. resume keeps the start of the interrupted list ----------------------------------


@pytest.mark.parametrize("max_parallel", [1, 2])
def test_resumed_list_records_its_own_start(database_url: str, instance: dg.DagsterInstance,
                                            max_parallel: int) -> None:
    ds = make_dataset(600, seed=5)
    with OAIServer(ds, page_size=50, snapshot_lists=True) as srv:
        h = add_harvester("j", srv.base_url, max_retries=0, max_parallel=max_parallel)
        # Run 1 starts its list at T1 and fails on page 4.
        srv.clock = lambda: T1
        srv.faults.add("status", verb="ListRecords", page=4, status=500, times=None)
        assert not run_job(h, instance).success
        srv.faults.clear()
        # A record changes after the list's snapshot was taken, before the resume.
        victim = next(r for r in ds if not r.deleted)
        changed = ServedRecord(victim.identifier, T1 + timedelta(minutes=10), victim.sets,
                               metadata=DC)
        ds.upsert(changed)
        # Run 2 (server clock an hour later) resumes the snapshot list and succeeds.
        srv.clock = lambda: T1 + timedelta(hours=1)
        resumed = run_job(h, instance)
        assert resumed.success
        meta = raw_meta(resumed)
        assert meta["oai/mode"] == "resumed"
        assert meta["oai/next_since"] == "2026-03-01T12:00:00Z"
        tick(instance, None, h)
        assert since_of(instance, h) == "2026-03-01T12:00:00Z"
        # Run 3 asks from before T1 and so gets the change the snapshot could not show.
        srv.clock = lambda: T1 + timedelta(hours=2)
        assert run_job(h, instance).success
        assert Store().snapshot("j") == expected_snapshot(ds)


# -- 4. clocks and the overlap -----------------------------------------------------------


def test_future_response_date_never_becomes_since(database_url: str, server: OAIServer,
                                                  instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    server.clock = lambda: datetime(2999, 1, 1, tzinfo=UTC)
    before = datetime.now(UTC)
    result = run_job(h, instance)
    assert result.success
    meta = raw_meta(result)
    assert "ahead of this machine's clock" in meta["oai/since_note"]
    tick(instance, None, h)
    recorded = datetime.fromisoformat(since_of(instance, h).replace("Z", "+00:00"))
    assert before - timedelta(seconds=2) <= recorded <= datetime.now(UTC)
    # With a since already recorded, a run from a server in the future keeps it.
    result = run_job(h, instance)
    assert raw_meta(result)["oai/next_since"] == since_of(instance, h)


def test_next_since_rules() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    ok = incremental.next_since(now - timedelta(minutes=1), Granularity.SECOND,
                                previous=None, now=now)
    assert ok.value == "2025-12-31T23:59:00Z" and ok.note == ""
    near = incremental.next_since(now + timedelta(minutes=5), Granularity.SECOND,
                                  previous=None, now=now)
    assert near.value == "2026-01-01T00:00:00Z"  # within the tolerance: our clock
    ahead = incremental.next_since(now + timedelta(hours=1), Granularity.DAY,
                                   previous="2025-12-30", now=now)
    assert ahead.value == "2025-12-30" and "ahead" in ahead.note
    assert incremental.request_from(now, Granularity.DAY, None) == now - timedelta(days=1)
    assert incremental.request_from(now, Granularity.SECOND, None) == now - timedelta(minutes=5)
    assert incremental.request_from(now, Granularity.SECOND, 0) == now


def test_overlap_catches_records_stamped_behind_the_server_clock(
    database_url: str, server: OAIServer, instance: dg.DagsterInstance
) -> None:
    h = add_harvester("j", server.base_url)
    assert run_job(h, instance).success
    tick(instance, None, h)
    # The server stamps a record two minutes before the responseDate it had already sent.
    server.dataset.add(ServedRecord("oai:demo.example.org:late", T1 - timedelta(minutes=2),
                                    ("datasets",), metadata=DC))
    server.clock = lambda: T1 + timedelta(hours=1)
    server.clear_log()
    result = run_job(h, instance)
    assert list_froms(server) == ["2026-03-01T11:55:00Z"]  # since minus 5 minutes
    assert raw_meta(result)["new"] == 1
    # An explicit overlap of one hour asks from an hour before.
    Registry().update("j", overlap=3600)
    tick(instance, None, fresh("j"))
    server.clear_log()
    run_job(fresh("j"), instance)
    assert list_froms(server) == ["2026-03-01T12:00:00Z"]


def test_operator_since_is_asked_exactly(database_url: str, server: OAIServer,
                                         instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    set_since(instance, h, asset_keys("j")[1], "2024-01-01T00:00:00Z")
    server.clear_log()
    result = run_job(h, instance)
    assert list_froms(server) == ["2024-01-01T00:00:00Z"]
    assert raw_meta(result)["oai/since_source"] == "operator"


@pytest.mark.parametrize("granularity", ["YYYY-MM-DD", "YYYY-MM-DDThh:mm:ssZ"])
def test_windowed_full_harvest_covers_records_outside_the_advertised_range(
    database_url: str, instance: dg.DagsterInstance, granularity: str
) -> None:
    ds = make_dataset(300, seed=9, granularity=granularity)
    ds.earliest_datestamp = datetime(2021, 1, 1, tzinfo=UTC)  # some records are older
    ds.add(ServedRecord("oai:demo.example.org:future", datetime(2026, 6, 1, tzinfo=UTC),
                        ("datasets",), metadata=DC))  # dated after the responseDate
    with OAIServer(ds, page_size=20) as srv:
        srv.clock = lambda: T1
        h = add_harvester("w", srv.base_url, max_parallel=3)
        assert run_job(h, instance).success
        assert Store().snapshot("w") == expected_snapshot(ds)


# -- 5. every path is governed alike -------------------------------------------------


def test_asset_graph_materialize_advances_since(database_url: str, server: OAIServer,
                                                instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    defs = build_definitions([h], LOCATION)
    job = defs.resolve_implicit_global_asset_job_def()
    _, raw_key, records_key = asset_keys("j")
    result = job.execute_in_process(instance=instance, asset_selection=[raw_key, records_key],
                                    raise_on_error=False)
    assert result.success
    assert result.dagster_run.job_name != h.job_name  # Dagster's implicit asset job,
    run = instance.get_run_by_id(result.run_id)  # which the op tags as the harvester's
    assert run is not None and run.tags["oaipmh/harvester"] == "j"
    assert since_of(instance, h) == "2026-03-01T12:00:00Z"  # read from the materialization
    tick(instance, None, h)
    assert current_state(instance, raw_key).source.startswith("run ")


def test_op_carries_a_pool_per_host(sqlite_url: str, server: OAIServer) -> None:
    h = add_harvester("j", server.base_url)
    job = build_definitions([h], LOCATION).resolve_job_def(h.job_name)
    (node,) = job.graph.node_defs
    assert node.pool == f"oaipmh/host/{h.host}"


def test_run_tags_show_since_resolved_at_start(database_url: str, server: OAIServer,
                                               instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    assert run_job(h, instance).success
    tick(instance, None, h)
    result = run_job(h, instance)
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags["oaipmh/since"] == "2026-03-01T12:00:00Z"
    assert tags["oaipmh/since_source"] == "run"


# -- 6. schedules never pile up ----------------------------------------------------------


def test_schedule_skips_while_a_run_is_queued_or_running(
    database_url: str, server: OAIServer, instance: dg.DagsterInstance
) -> None:
    h = add_harvester("j", server.base_url, cron="*/5 * * * *")
    defs = build_definitions([h], LOCATION)
    schedule = defs.get_repository_def().get_schedule_def(h.job_name)

    def evaluate():  # noqa: ANN202
        ctx = dg.build_schedule_context(instance=instance,
                                        scheduled_execution_time=datetime(2026, 1, 1, tzinfo=UTC))
        return schedule.evaluate_tick(ctx)

    first = evaluate()
    assert len(first.run_requests) == 1
    assert not first.run_requests[0].run_config  # since is resolved when the run starts
    run = instance.create_run_for_job(defs.resolve_job_def(h.job_name),
                                      tags={"oaipmh/harvester": "j"},
                                      status=dg.DagsterRunStatus.NOT_STARTED)
    skipped = evaluate()
    assert not skipped.run_requests
    assert run.run_id in skipped.skip_message
    instance.report_run_canceled(run)
    assert len(evaluate().run_requests) == 1


# -- 7. operators see and steer it ---------------------------------------------------------


def test_cursor_edit_is_not_undone_by_an_older_run(database_url: str, server: OAIServer,
                                                   instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    assert run_job(h, instance).success
    first = tick(instance, None, h)
    # A run finishes that the sensor has not processed yet ...
    server.clock = lambda: T1 + timedelta(days=1)
    assert run_job(h, instance).success
    # ... when the operator edits the cursor to re-harvest from 2024.
    edited = json.loads(first.cursor)
    edited["since"]["j"] = "2024-01-01"
    result = tick(instance, json.dumps(edited), h)
    assert json.loads(result.cursor)["since"] == {"j": "2024-01-01"}
    assert since_of(instance, h) == "2024-01-01"
    assert any("started before an operator's edit" in line for line in result.lines)
    # A run that starts after the edit moves it on.
    server.clock = lambda: T1 + timedelta(days=2)
    assert run_job(h, instance).success
    after = tick(instance, result.cursor, h)
    assert json.loads(after.cursor)["since"] == {"j": "2026-03-03T12:00:00Z"}


def test_deleting_the_cursor_entry_means_a_full_harvest(database_url: str, server: OAIServer,
                                                        instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    assert run_job(h, instance).success
    cursor = json.loads(tick(instance, None, h).cursor)
    del cursor["since"]["j"]
    tick(instance, json.dumps(cursor), h)
    assert since_of(instance, h) is None
    server.clear_log()
    assert run_job(h, instance).success
    assert list_froms(server) == [None]


@pytest.mark.parametrize("cursor", [
    '{"since": null}', "not json", "[1, 2]", '{"since": {"j": "yesterday"}, "published": {}}',
    '{"since": {}, "watermark": "junk"}',
])
def test_malformed_cursor_is_reported_and_ignored(database_url: str, server: OAIServer,
                                                  instance: dg.DagsterInstance,
                                                  cursor: str) -> None:
    h = add_harvester("j", server.base_url)
    assert run_job(h, instance).success
    tick(instance, None, h)
    result = tick(instance, cursor, h)  # must not raise
    assert result.lines and any("cursor" in line or "ignored" in line for line in result.lines)
    assert since_of(instance, h) == "2026-03-01T12:00:00Z"  # the published since holds
    json.loads(result.cursor)


def test_cursor_edited_during_a_tick_is_overwritten_by_it(sqlite_url: str,
                                                          server: OAIServer) -> None:
    """The tick returns the cursor it evaluated from the one it was given; the daemon
    writes that back, over an edit stored while the tick ran (docs/since.md)."""
    h = add_harvester("j", server.base_url)
    with dg.instance_for_test() as instance:
        edited = json.dumps({"since": {"j": "2024-01-01"}, "published": {}})
        start_sensor(instance, SENSOR_NAME, LOCATION, edited)  # stored during the tick
        sensor = build_definitions([h], LOCATION).get_repository_def().get_sensor_def(
            SENSOR_NAME)
        ctx = dg.build_sensor_context(instance=instance, cursor='{"since": {}}')
        result = sensor.evaluate_tick(ctx)
        assert result.cursor is not None and "2024-01-01" not in result.cursor
        assert "since" in json.loads(result.cursor)
        assert since_of(instance, h) is None  # the edit was never read


def test_an_empty_cursor_starts_at_now_and_loses_no_since(database_url: str,
                                                         server: OAIServer,
                                                         instance: dg.DagsterInstance) -> None:
    """A sensor of a new location name (or a cleared cursor) does not read the whole run
    history: its watermark starts now, and the since of a run it never processed is
    published from that run's materialization."""
    h = add_harvester("j", server.base_url)
    assert run_job(h, instance).success
    now = datetime.now(UTC) + timedelta(seconds=1)
    result = sensors.evaluate(instance, None, [h], LOCATION, now=now)
    sensors.report(instance, result)
    cursor = json.loads(result.cursor)
    assert cursor["watermark"] == now.isoformat()
    assert cursor["since"] == {"j": "2026-03-01T12:00:00Z"}
    state = since_mod.published_state(instance, asset_keys("j")[1])[0]
    assert state is not None and state.value == "2026-03-01T12:00:00Z"
    assert state.source.startswith("run ") and not state.operator  # asked with overlap


# -- 8. each code location takes only its own runs ----------------------------------------


def test_sensor_takes_only_its_own_harvesters(database_url: str, server: OAIServer,
                                              instance: dg.DagsterInstance) -> None:
    a = add_harvester("a", server.base_url)
    b = add_harvester("b", server.base_url)
    assert run_job(a, instance).success
    other = tick(instance, None, b, location="shard_1")
    assert json.loads(other.cursor)["since"] == {}
    assert not other.events
    mine = tick(instance, None, a, location="shard_0")
    assert json.loads(mine.cursor)["since"] == {"a": "2026-03-01T12:00:00Z"}


# -- 7b. the CLI: since show / set / reset, harvester show, update and remove ------------


def cli(*args: str) -> tuple[int, str, str]:
    """The console entry point in-process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from oaipmh_dagster.cli.commands import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_cli_since_show_set_reset(database_url: str, server: OAIServer) -> None:
    h = add_harvester("j", server.base_url)
    code, out, _ = cli("since", "show", "j")
    assert code == 0 and "since: - (none)" in out and "full harvest" in out
    instance = dg.DagsterInstance.get()
    assert run_job(h, instance).success
    code, out, _ = cli("since", "show", "j", "--json")
    report = json.loads(out)
    assert (report["since"], report["source"]) == ("2026-03-01T12:00:00Z", "run")
    assert "default overlap" in report["next_run"]
    assert report["last_success"]["run_id"]
    code, out, _ = cli("since", "set", "j", "2024-02-03")
    assert code == 0 and "from=2024-02-03" in out
    server.clear_log()
    assert run_job(h, instance).success
    assert list_froms(server) == ["2024-02-03T00:00:00Z"]  # exactly, no overlap
    code, out, _ = cli("since", "reset", "j")
    assert code == 0
    server.clear_log()
    assert run_job(h, instance).success
    assert list_froms(server) == [None]
    shown = json.loads(cli("harvester", "show", "j", "--json")[1])
    assert shown["since"]["since"] == "2026-03-01T12:00:00Z"
    assert "next run" in cli("harvester", "show", "j")[1]


@pytest.mark.parametrize("args, code", [
    (("since", "set", "j", "yesterday"), 2),
    (("since", "set", "j", "2999-01-01"), 2),
    (("since", "set", "nope", "2020-01-01"), 1),
    (("since", "reset", "nope"), 1),
    (("since", "show", "nope"), 1),
])
def test_cli_since_bad_input(sqlite_url: str, server: OAIServer, args: tuple, code: int) -> None:
    add_harvester("j", server.base_url)
    got, out, err = cli(*args)
    assert got == code
    assert len(err.strip().splitlines()) == 1 and err.startswith("oaipmh-dagster: error:")


def test_cli_update_and_remove_forget_since(database_url: str, server: OAIServer) -> None:
    h = add_harvester("j", server.base_url)
    instance = dg.DagsterInstance.get()
    assert run_job(h, instance).success
    code, out, _ = cli("harvester", "update", "j", "--set", "theses", "--no-check")
    assert code == 0 and "the next harvest is a full one" in out
    assert since_of(instance, fresh("j")) is None
    assert cli("harvester", "update", "j", "--all-sets", "--no-check")[0] == 0
    assert run_job(fresh("j"), instance).success
    assert since_of(instance, fresh("j")) == "2026-03-01T12:00:00Z"
    # Removed and added again with the same URL: it starts afresh.
    assert cli("harvester", "remove", "j", "--yes")[0] == 0
    again = add_harvester("j", server.base_url)
    assert since_of(instance, again) is None
    assert Store().state("j") is None


def test_since_report_reads_the_since_state_once(sqlite_url: str, server: OAIServer,
                                                 instance: dg.DagsterInstance,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`since show` resolves the since from the state it read for `recorded_by`, without
    asking the instance a second time."""
    h = add_harvester("j", server.base_url)
    assert run_job(h, instance).success
    tick(instance, None, h)
    calls = []

    def counted(*args: object) -> incremental.SinceState | None:
        calls.append(args)
        return current_state(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(since_mod, "current_state", counted)
    report = since_mod.since_report(instance, h, asset_keys(h.id)[1])
    assert len(calls) == 1
    assert (report["since"], report["source"]) == ("2026-03-01T12:00:00Z", "run")
    assert report["recorded_by"] is not None


def test_launchpad_since_out_of_range_fails_with_a_clear_error(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    """A since whose offset carries it before year 1 in UTC fails the run with a message
    that names the value (it was an OverflowError from inside the date arithmetic), and
    writes nothing."""
    h = add_harvester("j", server.base_url)
    result = run_job(h, instance, {"since": "0001-01-01T00:00:00+14:00"})
    assert not result.success
    failures = [e for e in result.all_events if e.is_failure]
    text = " ".join(str(e.event_specific_data) for e in failures)
    assert "out of range once converted to UTC" in text
    assert "OverflowError" not in text
    assert Store().count("j", live_only=False) == 0


def test_current_state_reads_runs_in_one_query_and_only_after_the_published_since(
        sqlite_url: str, server: OAIServer, instance: dg.DagsterInstance,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`harvester list` resolves every harvester's since: with runs not yet published
    their run records come in one query, not one each (5 ms apiece), and once the
    sensor has published, no earlier materialization is read at all."""
    h = add_harvester("j", server.base_url)
    for _ in range(3):
        assert run_job(h, instance).success
    raw_key = asset_keys(h.id)[1]
    expected = current_state(instance, raw_key)
    by_id: list[str] = []
    batched: list[object] = []
    real_by_id, real_records = instance.get_run_record_by_id, instance.get_run_records
    monkeypatch.setattr(instance, "get_run_record_by_id",
                        lambda run_id: by_id.append(run_id) or real_by_id(run_id))
    monkeypatch.setattr(instance, "get_run_records",
                        lambda *a, **k: batched.append(a) or real_records(*a, **k))
    state = current_state(instance, raw_key)
    assert state == expected and state is not None and state.value is not None
    assert by_id == [] and len(batched) == 1
    # Published by the sensor: nothing after it to read, no run looked up.
    monkeypatch.undo()
    tick(instance, None, h)
    published = current_state(instance, raw_key)
    fetched: list[int] = []
    real_fetch = instance.fetch_materializations

    def counted_fetch(*a: Any, **k: Any) -> Any:
        result = real_fetch(*a, **k)
        fetched.append(len(result.records))
        return result

    monkeypatch.setattr(instance, "fetch_materializations", counted_fetch)
    monkeypatch.setattr(instance, "get_run_records",
                        lambda *a, **k: batched.append(a) or real_records(*a, **k))
    batched.clear()
    assert current_state(instance, raw_key) == published
    assert fetched == [0] and batched == []


def test_harvester_states_read_every_run_in_one_query_and_no_published_materialization(
        sqlite_url: str, server: OAIServer, instance: dg.DagsterInstance,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`harvester list` at scale: the runs behind every harvester's unpublished sinces
    come in one query, and every harvester's newest run in another, not one per
    harvester; no harvester's materializations are read one by one, and once the sensor
    has published, no run behind a since is read at all."""
    from oaipmh_dagster.defs.harvester_state import harvester_states

    hs = [add_harvester(f"m{i}", server.base_url) for i in range(3)]
    for h in hs:
        assert run_job(h, instance).success

    def sinces() -> dict[str, str | None]:
        return {h.id: resolve_since(instance, h, since=None, full=False,
                                    raw_key=asset_keys(h.id)[1]).value for h in hs}

    expected = sinces()
    assert all(value is not None for value in expected.values())
    by_run_ids: list[list[str]] = []
    fetched: list[int] = []
    real_records, real_fetch = instance.get_run_records, instance.fetch_materializations

    def counted_records(*a: Any, **k: Any) -> Any:
        filters = k.get("filters", a[0] if a else None)
        if filters is not None and filters.run_ids:
            by_run_ids.append(list(filters.run_ids))
        return real_records(*a, **k)

    def counted_fetch(*a: Any, **k: Any) -> Any:
        result = real_fetch(*a, **k)
        fetched.append(len(result.records))
        return result

    monkeypatch.setattr(instance, "get_run_records", counted_records)
    monkeypatch.setattr(instance, "fetch_materializations", counted_fetch)
    states = harvester_states(instance, hs)
    assert {h.id: states[h.id]["since"] for h in hs} == expected
    assert [len(ids) for ids in by_run_ids] == [3, 3]  # behind the sinces; the newest
    assert fetched == []

    tick(instance, None, *hs)
    published = sinces()
    by_run_ids.clear()
    fetched.clear()
    states = harvester_states(instance, hs)
    assert {h.id: states[h.id]["since"] for h in hs} == published
    assert fetched == [] and [len(ids) for ids in by_run_ids] == [3]  # the newest runs
    assert all(states[h.id]["last_run"]["status"] == "SUCCESS" for h in hs)
