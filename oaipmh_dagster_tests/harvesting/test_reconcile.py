"""Reconciliation brings the store to the server: records a list skipped (offset-based
tokens over a list that changed mid-harvest) or whose new datestamp is older than since
are fetched, records the server no longer lists become tombstones that say so, and
records a listing skipped are kept. Counts in the materialization and the CLI summary;
a cadence for scheduled runs. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from oaipmh_dagster.cli import commands as cli
from oaipmh_dagster.defs.assets import RECONCILE_TAG, SCHEDULE_TAG
from oaipmh_dagster.demo.dataset import Dataset, ServedRecord, make_dataset
from oaipmh_dagster.harvesting.harvest import HarvestError, RunOptions, harvest
from oaipmh_dagster.harvesting.reconcile import NOT_LISTED
from oaipmh_dagster.storage.registry import InvalidHarvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.defs.test_since import op_name, raw_meta, run_job
from oaipmh_dagster_tests.harvesting.test_short_list import on_list_page
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

T1 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
OLD = datetime(2018, 6, 1, tzinfo=UTC)  # before every generated record


def dc(title: str) -> dict[str, str]:
    return {"oai_dc": "<oai_dc:dc xmlns:oai_dc='http://www.openarchives.org/OAI/2.0/oai_dc/' "
                      "xmlns:dc='http://purl.org/dc/elements/1.1/'>"
                      f"<dc:title>{title}</dc:title></oai_dc:dc>"}


def rebuilt(ds: Dataset, *, drop: set[str] = frozenset(),
            add: list[ServedRecord] = ()) -> Dataset:
    """A copy of `ds` without the records `drop` and with `add`."""
    return Dataset(granularity=ds.granularity, sets=ds.sets, formats=ds.formats,
                   deleted_record=ds.deleted_record,
                   records=[r for r in ds.records if r.identifier not in drop] + list(add))


def front(n: int, tag: str) -> list[ServedRecord]:
    """`n` new records dated before every other one: they sort to the list's front."""
    return [ServedRecord(f"oai:demo.example.org:{tag}{i}", OLD + timedelta(minutes=i), (),
                         False, dc(f"{tag} {i}")) for i in range(n)]


def live_and_tombs(store: Store, h_id: str) -> tuple[dict, dict]:
    """(identifier -> (datestamp, deleted, sets) as harvested, identifier -> errors of
    the tombstones reconciliation wrote)."""
    harvested, reconciled = {}, {}
    for item in store.iter_records(h_id):
        if any(e.get("type") == "not_listed" for e in item["errors"]):
            reconciled[item["oai_identifier"]] = item["errors"]
            assert item["deleted"] and item["metadata"] is None
        else:
            harvested[item["oai_identifier"]] = (item["datestamp"], item["deleted"],
                                                 tuple(item["sets"]))
    return harvested, reconciled


def reconcile_meta(meta: dict) -> dict:
    return {k.removeprefix("oai/reconcile_"): v for k, v in meta.items()
            if k.startswith("oai/reconcile_")}


@pytest.fixture
def offset_server():  # noqa: ANN201
    ds = make_dataset(100, seed=11, deleted_ratio=0.0)
    ds.deleted_record = "no"
    with OAIServer(ds, page_size=10, offset_tokens=True) as srv:
        srv.clock = lambda: T1
        yield srv


def test_offset_tokens_miss_front_inserts_and_reconcile_repairs(
        database_url: str, offset_server: OAIServer, instance: dg.DagsterInstance) -> None:
    srv = offset_server
    h = add_harvester("offs", srv.base_url)
    ds = srv.dataset
    inserted = front(5, "new")
    on_list_page(srv, 3, lambda: setattr(srv, "dataset", rebuilt(ds, add=inserted)))
    first = run_job(h, instance)
    assert first.success
    store = Store()
    missed = expected_snapshot(srv.dataset).keys() - store.snapshot("offs").keys()
    assert missed == {r.identifier for r in inserted}  # the list never showed them
    assert raw_meta(first)["oai/advances_since"] is True  # nothing looked wrong

    second = run_job(h, instance, {"reconcile": True})
    assert second.success
    meta = raw_meta(second)
    assert meta["oai/reconcile"] is True
    assert reconcile_meta(meta) == {"listed": 105, "missing_fetched": 5, "stale_fetched": 0,
                                    "tombstoned": 0, "kept": 0, "vanished": 0}
    assert store.snapshot("offs") == expected_snapshot(srv.dataset)
    run = instance.get_run_by_id(second.run_id)
    assert run.tags.get(RECONCILE_TAG) == "true"


def test_reconcile_tombstones_vanished_fetches_stale_and_is_idempotent(
        database_url: str, instance: dg.DagsterInstance) -> None:
    ds = make_dataset(50, seed=12, deleted_ratio=0.0)
    ds.deleted_record = "no"
    with OAIServer(ds, page_size=10) as srv:
        srv.clock = lambda: T1
        h = add_harvester("recon", srv.base_url)
        assert run_job(h, instance).success
        ids = [r.identifier for r in ds.records]
        vanished = set(ids[:3])
        changed = ds.records[10:12]
        new = front(2, "late")
        changed_now = [ServedRecord(r.identifier, r.datestamp + timedelta(days=1), r.sets,
                                    False, dc(f"changed {r.identifier}")) for r in changed]
        srv.dataset = rebuilt(ds, drop=vanished | {r.identifier for r in changed},
                              add=changed_now + new)
        srv.dataset.delete(ids[20], when=OLD)  # a tombstone dated before since
        result = run_job(h, instance, {"reconcile": True})
        assert result.success
        meta = raw_meta(result)
        assert reconcile_meta(meta) == {"listed": 49, "missing_fetched": 2,
                                        "stale_fetched": 3, "tombstoned": 3, "kept": 0,
                                        "vanished": 0}
        store = Store()
        harvested, reconciled = live_and_tombs(store, "recon")
        assert harvested == expected_snapshot(srv.dataset)
        assert set(reconciled) == vanished
        assert all(NOT_LISTED in e[0]["message"] for e in reconciled.values())
        changed_id = changed[0].identifier
        item = next(i for i in store.iter_records("recon") if i["oai_identifier"] == changed_id)
        assert item["metadata"]["title"] == [f"changed {changed_id}"]

        again = run_job(h, instance, {"reconcile": True})
        assert again.success
        assert reconcile_meta(raw_meta(again)) == {"listed": 49, "missing_fetched": 0,
                                                   "stale_fetched": 0, "tombstoned": 0,
                                                   "kept": 0, "vanished": 0}
        assert live_and_tombs(store, "recon") == (harvested, reconciled)

        # A record the server lists again is stored again, without the reconcile error.
        back = next(r for r in ds.records if r.identifier in vanished)
        srv.dataset.add(back)
        assert run_job(h, instance, {"reconcile": True}).success
        harvested, reconciled = live_and_tombs(store, "recon")
        assert back.identifier in harvested and back.identifier not in reconciled


def test_records_a_listing_skips_are_kept(database_url: str, offset_server: OAIServer,
                                          instance: dg.DagsterInstance) -> None:
    """Records already listed vanish from the front while the reconcile lists identifiers
    with offset tokens: the listing skips five live records; GetRecord finds them, so they
    are kept, not tombstoned. The next reconcile tombstones the five that vanished."""
    srv = offset_server
    h = add_harvester("skip", srv.base_url)
    assert run_job(h, instance).success
    ds = srv.dataset
    gone = {r.identifier for r in ds.records[:5]}
    done = []

    def vanish() -> None:
        done.append(True)
        srv.dataset = rebuilt(ds, drop=gone)

    srv.faults.add("delay", seconds=0, when=lambda info: (
        info.verb == "ListIdentifiers" and info.page == 2 and not done and vanish() and False))
    result = run_job(h, instance, {"reconcile": True})
    assert result.success and done
    assert reconcile_meta(raw_meta(result)) == {"listed": 95, "missing_fetched": 0,
                                                "stale_fetched": 0, "tombstoned": 0,
                                                "kept": 5, "vanished": 0}
    assert Store().count("skip") == 100  # nothing lost to the skipping list
    again = run_job(h, instance, {"reconcile": True})
    assert reconcile_meta(raw_meta(again)) == {"listed": 95, "missing_fetched": 0,
                                               "stale_fetched": 0, "tombstoned": 5,
                                               "kept": 0, "vanished": 0}
    harvested, reconciled = live_and_tombs(Store(), "skip")
    assert harvested == expected_snapshot(srv.dataset)
    assert set(reconciled) == gone


def test_reconcile_of_sets_tombstones_records_that_left_them(
        database_url: str, instance: dg.DagsterInstance) -> None:
    ds = make_dataset(60, seed=13, sets=4, deleted_ratio=0.0)
    spec = sorted({s for r in ds.records for s in r.sets if ":" not in s})[0]
    other = sorted({s for r in ds.records for s in r.sets if not s.startswith(spec)})[0]
    with OAIServer(ds, page_size=10) as srv:
        srv.clock = lambda: T1
        h = add_harvester("inset", srv.base_url, sets=(spec,))
        assert run_job(h, instance).success
        moved = next(r for r in ds.records if r.in_set(spec))
        srv.dataset.upsert(ServedRecord(moved.identifier, moved.datestamp, (other,), False,
                                        moved.metadata))
        result = run_job(h, instance, {"reconcile": True})
    assert result.success
    assert reconcile_meta(raw_meta(result))["tombstoned"] == 1
    _, reconciled = live_and_tombs(Store(), "inset")
    assert list(reconciled) == [moved.identifier]
    assert "no longer in the harvester's sets" in reconciled[moved.identifier][0]["message"]


def test_reconcile_refuses_partial_selections(database_url: str,
                                              offset_server: OAIServer) -> None:
    h = add_harvester("part", offset_server.base_url)
    for run in (RunOptions(reconcile=True, oai_ids=["oai:demo.example.org:1"]),
                RunOptions(reconcile=True, until="2020-01-01"),
                RunOptions(reconcile=True, sets=["x"])):
        with pytest.raises(HarvestError, match="whole selection"):
            harvest(h, Store(), run, run_id="r")
    assert offset_server.requests == []  # refused before any request


def scheduled(h, instance: dg.DagsterInstance, config: dict | None = None):  # noqa: ANN001, ANN201
    from oaipmh_dagster.definitions import build_definitions

    job = build_definitions([h], "oaipmh_dagster").resolve_job_def(h.job_name)
    return job.execute_in_process(
        run_config={"ops": {op_name(h.id): {"config": config or {}}}}, instance=instance,
        tags={SCHEDULE_TAG: h.job_name}, raise_on_error=False)


def test_every_nth_scheduled_run_reconciles(database_url: str, offset_server: OAIServer,
                                            instance: dg.DagsterInstance) -> None:
    h = add_harvester("cadence", offset_server.base_url, reconcile_every=3)
    flags = [raw_meta(scheduled(h, instance))["oai/reconcile"] for _ in range(5)]
    assert flags == [True, False, False, True, False]
    # Runs not started by the schedule follow their config only.
    assert raw_meta(run_job(h, instance))["oai/reconcile"] is False
    assert raw_meta(scheduled(h, instance, {"reconcile": False}))["oai/reconcile"] is False
    h_never = add_harvester("never", offset_server.base_url)
    assert raw_meta(scheduled(h_never, instance))["oai/reconcile"] is False


def test_reconcile_every_is_validated_and_stored(database_url: str) -> None:
    for bad in (0, -1, 10_001, 1.5, True):
        with pytest.raises(InvalidHarvester, match="reconcile_every"):
            add_harvester("bad", "http://127.0.0.1:9/oai", reconcile_every=bad)
    add_harvester("ok", "http://127.0.0.1:9/oai", reconcile_every=7)
    assert Registry().get("ok").reconcile_every == 7
    assert Registry().get("ok").to_dict()["reconcile_every"] == 7


def test_cli_reconcile_option_and_summary(database_url: str, offset_server: OAIServer,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    def cli_run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            cli.main(list(argv))
        out = capsys.readouterr()
        return done.value.code or 0, out.out, out.err

    code, out, err = cli_run("harvester", "add", "clirec", "--url", offset_server.base_url,
                             "--prefix", "oai_dc", "--no-check", "--reconcile-every", "4")
    assert code == 0, err
    assert Registry().get("clirec").reconcile_every == 4
    code, out, err = cli_run("harvester", "update", "clirec", "--reconcile-every", "0")
    assert code == 0, err
    assert Registry().get("clirec").reconcile_every is None
    assert cli_run("harvest", "clirec")[0] == 0
    ds = offset_server.dataset
    offset_server.dataset = rebuilt(ds, add=front(3, "cli"))
    code, out, err = cli_run("harvest", "clirec", "--reconcile")
    assert code == 0, err
    assert "reconcile: 103 listed, 3 missing fetched, 0 stale fetched, 0 tombstoned" in out
    code, _, err = cli_run("harvest", "clirec", "--reconcile", "--until", "2020-01-01")
    assert code == 2 and "--reconcile" in err
