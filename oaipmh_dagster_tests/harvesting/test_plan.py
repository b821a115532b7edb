"""The harvest plan: from/until, sets, windows and the resume point, decided without a
server or a database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from oaipmh_dagster.harvesting.plan import (
    ListCheckpoint,
    PlanError,
    RunOptions,
    WindowedCheckpoint,
    checkpoint_from_json,
    make_plan,
    validate,
)
from oaipmh_dagster.harvesting.windows import Window, WindowState
from oaipmh_dagster.oai import Granularity, Identify
from oaipmh_dagster.storage.registry import Harvester

NOW = datetime(2024, 6, 1, 12, 0, 0, tzinfo=UTC)
EARLIEST = datetime(2020, 1, 1, tzinfo=UTC)


def ident(granularity: Granularity = Granularity.SECOND,
          earliest: datetime | None = EARLIEST) -> Identify:
    return Identify(repository_name="r", base_url="http://x/oai", protocol_version="2.0",
                    earliest_datestamp=earliest, granularity=granularity,
                    deleted_record="persistent", admin_emails=[], response_date=NOW)


def harvester(**kw: Any) -> Harvester:
    return Harvester(**{"id": "h", "base_url": "http://x/oai", "metadata_prefix": "oai_dc",
                        **kw})


# What the harvest loop saved before checkpoints were typed (still read).
SEQUENTIAL_JSON = {
    "args": {"metadataPrefix": "oai_dc", "set": "b", "from": "2024-01-01T00:00:00Z",
             "until": None},
    "token": "tok-7", "set": "b", "pages": 7, "records": 700,
    "since": "2024-01-01T00:00:00Z", "until": None, "list_start": "2024-05-01T00:00:00+00:00",
}
WINDOWED_JSON = {
    "mode": "windowed", "prefix": "oai_dc", "sets": [], "since": None, "until": None,
    "list_start": "2024-05-01T00:00:00+00:00",
    "windows": {
        "|*|2022-01-01T00:00:00Z": {"set": None, "from": "2020-01-01T00:00:00Z",
                                    "until": "2022-01-01T00:00:00Z", "open_start": True,
                                    "open_end": False, "token": None, "done": True,
                                    "depth": 1},
        "|2022-01-01T00:00:01Z|*": {"set": None, "from": "2022-01-01T00:00:01Z",
                                    "until": "2024-06-01T12:00:00Z", "open_start": False,
                                    "open_end": True, "token": "w-3", "done": False,
                                    "depth": 1},
    },
}


def test_full_sequential_plan() -> None:
    plan = make_plan(harvester(sets=("a", "b")), RunOptions(full=True), ident())
    assert (plan.mode, plan.since, plan.until, plan.sets) == ("full", None, None, ("a", "b"))
    assert plan.list_start == NOW and plan.covers_sets and not plan.windowed
    assert plan.resume is None and plan.notes == ()


def test_since_with_overlap_is_asked_earlier_in_the_server_granularity() -> None:
    plan = make_plan(harvester(), RunOptions(since="2024-03-10", overlap=True),
                     ident(Granularity.DAY))
    assert (plan.mode, plan.since) == ("incremental", "2024-03-09")
    plain = make_plan(harvester(overlap=60), RunOptions(since="2024-03-10T00:00:00Z",
                                                        overlap=True), ident())
    assert plain.since == "2024-03-09T23:59:00Z"


def test_run_sets_replace_the_harvesters_and_are_asked_once() -> None:
    plan = make_plan(harvester(sets=("a",)), RunOptions(sets=["b", "c", "b"]), ident())
    assert plan.sets == ("b", "c") and not plan.covers_sets


def test_parallel_plan_has_one_open_window_per_set() -> None:
    plan = make_plan(harvester(max_parallel=4, sets=("a", "b")), RunOptions(), ident())
    assert plan.windows is not None and plan.window_range == (EARLIEST, NOW)
    assert [(u.window.set_spec, u.window.open_start, u.window.open_end, u.done)
            for u in plan.windows] == [("a", True, True, False), ("b", True, True, False)]
    bounded = make_plan(harvester(max_parallel=4),
                        RunOptions(since="2023-01-01", until="2023-12-31"), ident())
    assert bounded.windows is not None
    assert bounded.windows[0].window.bounds(Granularity.SECOND) == (
        "2023-01-01T00:00:00Z", "2023-12-31T23:59:59Z")  # until a day: its end


def test_parallel_without_earliest_datestamp_is_sequential() -> None:
    plan = make_plan(harvester(max_parallel=4), RunOptions(), ident(earliest=None))
    assert not plan.windowed and plan.mode == "full"
    assert plan.notes == (("info", "the server gives no earliestDatestamp: harvesting "
                                   "sequentially"),)


def test_oai_ids_plan() -> None:
    plan = make_plan(harvester(), RunOptions(oai_ids=["x", "y"]), ident())
    assert (plan.mode, plan.oai_ids, plan.windows, plan.resume) == (
        "oai_ids", ("x", "y"), None, None)


def test_resumes_a_sequential_checkpoint_of_the_same_list() -> None:
    h = harvester(sets=("a", "b"))
    plan = make_plan(h, RunOptions(since="2024-01-01T00:00:00Z"), ident(), SEQUENTIAL_JSON)
    assert plan.mode == "resumed" and plan.resume is not None
    assert (plan.resume.token, plan.resume.set_spec, plan.resume.pages) == ("tok-7", "b", 7)
    assert plan.checkpoint_start == "2024-05-01T00:00:00+00:00"
    assert plan.resumed_list_start == datetime(2024, 5, 1, tzinfo=UTC)
    assert plan.list_start == NOW  # the server's clock: the loop keeps the earlier one


@pytest.mark.parametrize("run, h", [
    (RunOptions(since="2024-02-01T00:00:00Z"), harvester(sets=("a", "b"))),  # other since
    (RunOptions(since="2024-01-01T00:00:00Z"), harvester(sets=("a",))),  # set not harvested
    (RunOptions(since="2024-01-01T00:00:00Z", resume=False), harvester(sets=("a", "b"))),
    (RunOptions(since="2024-01-01T00:00:00Z"),
     harvester(sets=("a", "b"), metadata_prefix="marc21")),
])
def test_a_checkpoint_of_another_list_is_not_resumed(run: RunOptions, h: Harvester) -> None:
    plan = make_plan(h, run, ident(), SEQUENTIAL_JSON)
    assert plan.resume is None and plan.mode == "incremental"
    assert plan.checkpoint_start == NOW.isoformat()


@pytest.mark.parametrize("run, h, keeps", [
    (RunOptions(since="2024-02-01T00:00:00Z"), harvester(sets=("a", "b")), True),
    (RunOptions(since="2024-01-01T00:00:00Z"), harvester(sets=("a",)), True),
    (RunOptions(since="2024-01-01T00:00:00Z", until="2024-03-01"), harvester(sets=("b",)),
     True),
    (RunOptions(oai_ids=["x"]), harvester(sets=("b",)), True),
    (RunOptions(since="2024-01-01T00:00:00Z", resume=False), harvester(sets=("a", "b")),
     False),  # reads that very list from its start
    (RunOptions(), harvester(sets=("b",)), False),  # a full list holds it
    (RunOptions(since="2023-06-01"), harvester(), False),  # so does an earlier since's
    (RunOptions(), harvester(metadata_prefix="marc21"), False),  # another prefix's
    (RunOptions(), harvester(sets=("b",), max_parallel=2), False),  # windows of it
])
def test_a_checkpoint_of_a_list_the_harvest_does_not_read_is_kept(
    run: RunOptions, h: Harvester, keeps: bool,
) -> None:
    """`keeps`: the checkpoint a successful harvest leaves for the harvest that continues
    it (None: nothing is left to continue, the success clears it)."""
    plan = make_plan(h, run, ident(), SEQUENTIAL_JSON)
    assert plan.resume is None
    assert plan.keeps == (SEQUENTIAL_JSON if keeps else None)
    [said] = [note for _, note in plan.notes if "interrupted harvest" in note]
    where = "(oai_dc, from=2024-01-01T00:00:00Z, until=-, set b)"
    assert said.startswith(f"this harvest keeps the interrupted harvest's checkpoint {where}"
                           if keeps else f"not resuming the interrupted harvest {where}")


def test_a_resumed_checkpoint_is_not_kept() -> None:
    plan = make_plan(harvester(sets=("a", "b")), RunOptions(since="2024-01-01T00:00:00Z"),
                     ident(), SEQUENTIAL_JSON)
    assert plan.mode == "resumed" and plan.keeps is None


def test_resumes_the_unfinished_windows_of_a_windowed_checkpoint() -> None:
    plan = make_plan(harvester(max_parallel=2), RunOptions(), ident(), WINDOWED_JSON)
    assert plan.mode == "resumed" and plan.windows is not None
    assert [(u.key, u.token, u.done) for u in plan.windows] == [
        ("|*|2022-01-01T00:00:00Z", None, True), ("|2022-01-01T00:00:01Z|*", "w-3", False)]
    assert plan.checkpoint_start == "2024-05-01T00:00:00+00:00"
    other = make_plan(harvester(max_parallel=2), RunOptions(since="2023-01-01"), ident(),
                      WINDOWED_JSON)
    assert other.mode == "incremental" and all(not u.done for u in other.windows or ())


@pytest.mark.parametrize("saved, why", [
    ({**SEQUENTIAL_JSON, "list_start": None}, "does not say when its list started"),
    (["not", "an", "object"], "is not a JSON object"),
    ({**WINDOWED_JSON, "windows": {"k": {"set": None}}}, "cannot be read"),
])
def test_an_unreadable_checkpoint_restarts_the_list_with_a_warning(saved: Any, why: str) -> None:
    plan = make_plan(harvester(max_parallel=2), RunOptions(), ident(), saved)
    assert plan.mode == "full" and plan.resume is None
    assert plan.windows is not None and all(not u.done for u in plan.windows)
    [(level, message)] = plan.notes
    assert level == "warning" and why in message and "starting the list again" in message


def test_checkpoints_round_trip_through_json() -> None:
    seq = checkpoint_from_json(SEQUENTIAL_JSON, Granularity.SECOND)
    assert isinstance(seq, ListCheckpoint) and seq.to_json() == SEQUENTIAL_JSON
    win = checkpoint_from_json(WINDOWED_JSON, Granularity.SECOND)
    assert isinstance(win, WindowedCheckpoint) and win.to_json() == WINDOWED_JSON
    day = WindowedCheckpoint("oai_dc", ("s",), "2024-01-01", None, "x", Granularity.DAY, (
        WindowState(Window("s", EARLIEST, datetime(2024, 6, 1, tzinfo=UTC)), "s|2020-01-01|2024-06-01",
                    "t", False, 2),))
    assert checkpoint_from_json(day.to_json(), Granularity.DAY) == day


@pytest.mark.parametrize("run, message", [
    (RunOptions(since="2024-02-01", until="2024-01-01"), "is after until"),
    (RunOptions(sets=["ok", "a&verb=Identify"]), "invalid set spec"),
    (RunOptions(reconcile=True, oai_ids=["x"]), "whole selection"),
    (RunOptions(reconcile=True, until="2024-01-01"), "whole selection"),
    (RunOptions(reconcile=True, sets=["other"]), "whole selection"),
])
def test_bad_run_options_are_refused(run: RunOptions, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        validate(harvester(), run)
    with pytest.raises(PlanError, match=message):
        make_plan(harvester(), run, ident())
