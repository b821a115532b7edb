"""Dates that must not poison since: whatever a server's clock, an operator, a run config
or the sensor's cursor says, a since before the repository's earliestDatestamp or ahead
of this machine's clock is refused or clamped with a warning naming where it came from,
never an exception, and no change is lost. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.defs.since import since_observation, since_report
from oaipmh_dagster.demo.dataset import ServedRecord, make_dataset
from oaipmh_dagster.harvesting import incremental
from oaipmh_dagster.harvesting.plan import RunOptions
from oaipmh_dagster.oai import Granularity
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.defs.test_since import cli, list_froms, raw_meta, run_job, since_of, tick
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

T1 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
EARLIEST = datetime(2020, 1, 1, tzinfo=UTC)
DC = {"oai_dc": "<oai_dc:dc xmlns:oai_dc='http://www.openarchives.org/OAI/2.0/oai_dc/'/>"}


@pytest.fixture
def server() -> Iterator[OAIServer]:
    ds = make_dataset(200, seed=4)
    ds.earliest_datestamp = EARLIEST
    with OAIServer(ds, page_size=100) as srv:
        srv.clock = lambda: T1
        yield srv


def list_untils(srv: OAIServer) -> list[str | None]:
    return [(r.params.get("until") or [None])[0] for r in srv.requests
            if r.verb == "ListRecords" and "resumptionToken" not in r.params]


def publish(instance: dg.DagsterInstance, h: Harvester, value: str, source: str, *,
            operator: bool) -> None:
    """A since as an older version (or a hand-made observation) could have published it."""
    scope = incremental.scope(h.base_url, h.metadata_prefix, h.sets)
    instance.report_runless_asset_event(
        since_observation(asset_keys(h.id)[1], value, scope, source, operator=operator))


def warnings_of(result: dg.ExecuteInProcessResult, instance: dg.DagsterInstance) -> str:
    """Every user log line of the run (its warnings included)."""
    records = instance.get_records_for_run(result.run_id).records
    return "\n".join(r.event_log_entry.user_message for r in records
                     if not r.event_log_entry.is_dagster_event)


# -- the rule ------------------------------------------------------------------------------


def test_one_rule_judges_every_since_and_never_raises() -> None:
    now = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
    check = incremental.check_since
    ok = check("2026-05-01", "since from the run config", now=now, earliest=EARLIEST)
    assert ok.verdict == "ok" and ok.when == datetime(2026, 5, 1, tzinfo=UTC) and not ok.message
    near = check(now + timedelta(minutes=8), "since set by operator", now=now)
    assert near.verdict == "ok" and near.when == now + timedelta(minutes=8)
    late = check("2999-01-01", "cursor edit of j", now=now, earliest=EARLIEST)
    assert late.verdict == "ahead" and late.when is None
    assert "cursor edit of j" in late.message and "2999-01-01" in late.message
    early = check("0001-01-01T00:00:00Z", "since recorded by run 1a2b3c4d", now=now,
                  earliest=EARLIEST)
    assert early.verdict == "before_earliest"
    assert "run 1a2b3c4d" in early.message and "0001-01-01T00:00:00Z" in early.message
    assert "2020-01-01" in early.message
    # An earliestDatestamp ahead of the clock says nothing.
    assert check("2024-01-01", "x", now=now, earliest=datetime(2999, 1, 1, tzinfo=UTC)
                 ).verdict == "ok"
    for bad in ("yesterday", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", ""):
        assert check(bad, "x", now=now).verdict == "unreadable"
    assert check("9999-12-31T23:59:59Z", "x", now=now).verdict == "ahead"


def test_next_since_is_never_later_than_this_machines_clock() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    near = incremental.next_since(now + timedelta(minutes=8), Granularity.SECOND,
                                  previous=None, now=now)
    assert near.value == "2026-01-01T00:00:00Z"
    early = incremental.next_since(datetime(1, 1, 1, tzinfo=UTC), Granularity.SECOND,
                                   previous="2025-12-30T00:00:00Z", now=now, earliest=EARLIEST)
    assert early.value == "2025-12-30T00:00:00Z" and "earliestDatestamp" in early.note
    first = incremental.next_since(datetime(1, 1, 1, tzinfo=UTC), Granularity.DAY,
                                   previous=None, now=now, earliest=EARLIEST)
    assert first.value == "2026-01-01" and "0001-01-01" in first.note


def test_a_resumed_list_records_a_trusted_start() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    older = now - timedelta(hours=1)
    sec = Granularity.SECOND
    assert incremental.next_since(now, sec, previous=None, now=now,
                                  resumed_start=older).value == "2025-12-31T23:00:00Z"
    # The server's clock is refused now, the interrupted list started at a trusted time.
    ahead = incremental.next_since(datetime(2999, 1, 1, tzinfo=UTC), sec, previous=None,
                                   now=now, resumed_start=older)
    assert ahead.value == "2025-12-31T23:00:00Z" and "interrupted" in ahead.note
    # A start of year 1 kept by an older checkpoint is not recorded.
    poisoned = incremental.next_since(now, sec, previous="2025-06-01T00:00:00Z", now=now,
                                      earliest=EARLIEST,
                                      resumed_start=datetime(1, 1, 1, tzinfo=UTC))
    assert poisoned.value == "2025-06-01T00:00:00Z" and "earliestDatestamp" in poisoned.note


def test_request_from_never_overflows() -> None:
    year_one = datetime(1, 1, 1, tzinfo=UTC)
    for gran in Granularity:
        assert incremental.request_from(year_one, gran, None) == year_one
        assert incremental.request_from(year_one, gran, 10**6) == year_one


# -- a server's responseDate ---------------------------------------------------------------


def test_response_date_of_year_one_never_poisons_since(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    """A responseDate of 0001-01-01 made every later run fail with OverflowError."""
    h = add_harvester("j", server.base_url)
    server.clock = lambda: datetime(1, 1, 1, tzinfo=UTC)
    first = run_job(h, instance)
    assert first.success
    meta = raw_meta(first)
    assert "0001-01-01" in meta["oai/since_note"] and "earliestDatestamp" in meta["oai/since_note"]
    assert not meta["oai/next_since"].startswith("0001")
    tick(instance, None, h)
    assert not (since_of(instance, h) or "").startswith("0001")
    second = run_job(h, instance)
    assert second.success
    assert Store().snapshot("j") == expected_snapshot(server.dataset)


@pytest.mark.parametrize("operator", [False, True])
def test_a_stored_since_before_earliest_is_asked_without_from(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance,
        operator: bool) -> None:
    """A poisoned since already published (by an older version, or an operator's typo)
    harvests in full with a warning naming its source, and is then replaced."""
    h = add_harvester("j", server.base_url)
    publish(instance, h, "0001-01-01T00:00:00Z", "run 0badc0de" if not operator
            else "operator (cursor edit)", operator=operator)
    result = run_job(h, instance)
    assert result.success
    assert list_froms(server) == [None]
    log = warnings_of(result, instance)
    assert "0001-01-01T00:00:00Z" in log and "earliestDatestamp" in log
    assert ("run 0badc0de" if not operator else "operator (cursor edit)") in log
    tick(instance, None, h)
    assert since_of(instance, h) == "2026-03-01T12:00:00Z"
    assert Store().snapshot("j") == expected_snapshot(server.dataset)


@pytest.mark.parametrize("overlap", [None, 0, 60])
def test_server_clock_minutes_ahead_loses_no_change(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance,
        overlap: int | None) -> None:
    """A server whose responseDate runs 8 minutes ahead (within the 10-minute tolerance),
    stamping records with a correct clock: the change made after the first harvest's list
    started is asked for by the next one, whatever the harvester's overlap."""
    h = add_harvester("j", server.base_url, overlap=overlap)
    server.clock = lambda: datetime.now(UTC) + timedelta(minutes=8)
    assert run_job(h, instance).success
    tick(instance, None, h)
    changed = ServedRecord("oai:demo.example.org:late", datetime.now(UTC).replace(microsecond=0),
                           ("datasets",), metadata=DC)
    server.dataset.add(changed)
    result = run_job(h, instance)
    assert result.success
    assert raw_meta(result)["new"] == 1
    assert Store().snapshot("j") == expected_snapshot(server.dataset)


# -- an operator: the sensor's cursor, the CLI, the run config ------------------------------


def test_far_future_date_typed_into_the_cursor_is_refused(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    assert run_job(h, instance).success
    cursor = json.loads(tick(instance, None, h).cursor)
    cursor["since"]["j"] = "2999-01-01"
    result = tick(instance, json.dumps(cursor), h)
    assert any("2999-01-01" in line and "ahead" in line for line in result.lines)
    assert since_of(instance, h) == "2026-03-01T12:00:00Z"
    assert json.loads(result.cursor)["since"]["j"] == "2026-03-01T12:00:00Z"
    # The same date as the CLI refuses it.
    code, _, err = cli("since", "set", "j", "2999-01-01")
    assert code == 2 and "ahead" in err


def test_a_stored_far_future_since_harvests_in_full_then_heals(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    """Published by an older version, a since of 2999 made every run succeed with 0
    records for ever."""
    h = add_harvester("j", server.base_url)
    publish(instance, h, "2999-01-01", "operator (cursor edit)", operator=True)
    report = since_report(instance, h, asset_keys("j")[1])
    assert report["next_run"].startswith("full harvest") and "2999-01-01" in report["next_run"]
    result = run_job(h, instance)
    assert result.success
    assert list_froms(server) == [None]
    assert Store().snapshot("j") == expected_snapshot(server.dataset)
    log = warnings_of(result, instance)
    assert "2999-01-01" in log and "operator (cursor edit)" in log and "ahead" in log
    tick(instance, None, h)
    assert since_of(instance, h) == "2026-03-01T12:00:00Z"


def test_cursor_edit_of_since_alone_is_understood(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    """`{"since": {"j": DATE}}`, what an operator types in the cursor editor, was
    silently dropped once a since was published."""
    h = add_harvester("j", server.base_url)
    assert run_job(h, instance).success
    tick(instance, None, h)
    result = tick(instance, '{"since": {"j": "2024-01-01"}}', h)
    assert since_of(instance, h) == "2024-01-01"
    assert any("2024-01-01" in line for line in result.lines)
    server.clear_log()
    assert run_job(h, instance).success
    assert list_froms(server) == ["2024-01-01T00:00:00Z"]


def test_run_config_since_ahead_of_the_clock_fails_the_run(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    result = run_job(h, instance, {"since": "2999-01-01"})
    assert not result.success
    text = " ".join(str(e.event_specific_data) for e in result.all_events if e.is_failure)
    assert "2999-01-01" in text and "run config" in text and "ahead" in text
    assert Store().count("j", live_only=False) == 0
    code, _, err = cli("harvest", "j", "--since", "2999-01-01")
    assert code == 2 and err.startswith("oaipmh-dagster: error:") and "ahead" in err


def test_run_config_since_before_earliest_is_asked_without_from(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url, overlap=0)
    result = run_job(h, instance, {"since": "0001-01-01"})
    assert result.success
    assert list_froms(server) == [None]
    assert "run config" in warnings_of(result, instance)


# -- until ------------------------------------------------------------------------------------


def test_until_day_means_the_end_of_that_day() -> None:
    assert RunOptions(until="2024-03-10").until_dt() == datetime(2024, 3, 10, 23, 59, 59,
                                                                 tzinfo=UTC)
    assert RunOptions(until="2024-03-10T08:00:00Z").until_dt() == datetime(
        2024, 3, 10, 8, tzinfo=UTC)


def test_until_day_on_a_seconds_server_through_run_config_and_cli(
        database_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    assert run_job(h, instance, {"until": "2024-03-10"}).success
    assert list_untils(server) == ["2024-03-10T23:59:59Z"]
    server.clear_log()
    code, _, err = cli("harvest", "j", "--since", "2024-03-10T12:00:00Z", "--until", "2024-03-10")
    assert code == 0, err
    assert list_untils(server) == ["2024-03-10T23:59:59Z"]
    assert list_froms(server) == ["2024-03-10T12:00:00Z"]
