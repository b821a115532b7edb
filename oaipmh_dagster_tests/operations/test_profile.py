"""Field coverage: exact fractions and distinct counts of a known data set, deleted records
left out, the distinct cap, sampling, the Markdown table, the CLI and the records asset."""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import pytest

from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.operations.profile import (
    DISTINCT_CAP,
    MAX_FIELDS,
    MAX_RECORDS,
    SHORT_MAX,
    bar,
    coverage_markdown,
    profile_records,
    profile_store,
)
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.conftest import Result
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.storage.test_store import rec, title_of

LONG = "x" * (SHORT_MAX + 1)

# Live: 1, 2, 3 and 5 (5 failed to transform: live, no metadata); 4 is deleted.
METADATA: dict[str, dict[str, Any]] = {
    "oai:k:1": {"id": "k1", "title": ["A"], "date": ["2020"], "rights": [], "year": 0,
                "abstract": LONG, "types": {"general": "Text", "specific": ""}},
    "oai:k:2": {"id": "k2", "title": ["B", "A"], "date": [], "rights": ["cc-by"],
                "year": None, "abstract": "", "types": {"general": "Text"}},
    "oai:k:3": {"id": "k3", "title": [""], "date": ["2021"], "rights": ["cc-by"],
                "year": 2021, "abstract": "  ", "types": None},
}


def _known(raw: str, element: object = None) -> dict[str, Any]:
    identifier = title_of(raw)["title"]
    if identifier not in METADATA:
        raise ValueError(f"cannot read {identifier}")
    return METADATA[identifier]


@pytest.fixture
def known(database_url: str) -> Store:
    """Harvester `k`: the records of METADATA, a tombstone and a failed record."""
    store = Store(db.get_engine(database_url))
    write_page(store, "k", [rec("oai:k:1"), rec("oai:k:2"), rec("oai:k:3"),
                            rec("oai:k:4", deleted=True), rec("oai:k:5")],
               run_id="r1", transform=_known)
    write_page(store, "other", [rec("oai:o:1")], run_id="r1", transform=title_of)
    return store


def test_known_data_set(known: Store) -> None:
    p = profile_store(known, "k")
    assert p.records == 4 and p.live == 4 and not p.sampled  # the tombstone left out
    # Highest first, then by name; `types` (a dict, null in 3) is only its keys.
    assert list(p.coverage().items()) == [
        ("id", 0.75), ("date", 0.5), ("rights", 0.5), ("title", 0.5),
        ("types.general", 0.5), ("year", 0.5), ("abstract", 0.25), ("types.specific", 0.0)]
    # title counts list elements (A, B); year 0 and 2021; abstract has a long value.
    assert p.distinct() == {"id": 3, "date": 2, "rights": 1, "title": 2,
                            "types.general": 1, "year": 2, "types.specific": 0}


def test_empty_harvester(database_url: str) -> None:
    p = profile_store(Store(db.get_engine(database_url)), "nothing")
    assert p.to_json() == {"coverage": {}, "records": 0, "distinct": {}, "live": 0,
                           "sampled": False, "fields_dropped": 0}
    assert coverage_markdown(p) == "_no live records_"


def test_only_tombstones(database_url: str) -> None:
    store = Store(db.get_engine(database_url))
    write_page(store, "gone", [rec("oai:g:1", deleted=True)], run_id="r", transform=title_of)
    assert profile_store(store, "gone").to_json()["records"] == 0


@pytest.mark.parametrize(("n", "expected"), [(DISTINCT_CAP, DISTINCT_CAP),
                                             (DISTINCT_CAP + 1, f"{DISTINCT_CAP}+")])
def test_distinct_cap(n: int, expected: int | str) -> None:
    p = profile_records([{"id": str(i), "kind": "same"} for i in range(n)] * 2)
    assert p.distinct() == {"id": expected, "kind": 1}
    assert p.coverage() == {"id": 1.0, "kind": 1.0}


def test_long_field_after_short_values() -> None:
    p = profile_records([{"d": "a"}, {"d": LONG}, {"d": "b"}])
    assert p.distinct() == {}
    assert p.coverage() == {"d": 1.0}


def test_presence_rules() -> None:
    p = profile_records([
        {"n": 0, "b": False, "l": [None, " "], "d": {"x": {"y": "v"}}, "e": {}},
        {"n": None, "b": True, "l": [[], "z"], "d": {"x": None}, "e": {"k": ""}},
        None,
        {"dl": [{"a": ""}], "dm": [{"a": "1"}, {"a": "1"}]},
    ])
    assert p.records == 4
    assert p.coverage() == {"b": 0.5, "d.x.y": 0.25, "dm": 0.25, "l": 0.25, "n": 0.25,
                            "dl": 0.0, "e.k": 0.0}
    assert "dm" not in p.distinct()  # dict elements: structured, no distinct count
    assert p.fields["dm"].distinct_label == "structured values"
    assert p.distinct()["b"] == 2
    assert p.distinct()["n"] == 1


def test_fields_past_max_fields() -> None:
    p = profile_records([{f"f{i:04d}": "v" for i in range(MAX_FIELDS + 3)}] * 2)
    assert len(p.coverage()) == MAX_FIELDS and p.fields_dropped == 6
    assert f"Only the first {MAX_FIELDS} fields are followed; 6 values of further " \
        "fields were not counted." in coverage_markdown(p)


def test_sample_past_max_records(database_url: str) -> None:
    store = Store(db.get_engine(database_url))
    records = [rec(f"oai:s:{i:02d}") for i in range(10)]
    write_page(store, "s", records, run_id="r", transform=title_of)
    p = profile_store(store, "s", max_records=3, batch=2)
    # One in every ceil(10 / 3) = 4 by identifier: 00, 04, 08.
    assert (p.records, p.live, p.sampled) == (3, 10, True)
    assert p.distinct() == {"title": 3}
    assert p.fields["title"].values == {"oai:s:00", "oai:s:04", "oai:s:08"}
    assert "A sample: 3 of 10 live records (one in every 4 by identifier)." in \
        coverage_markdown(p)
    assert profile_store(store, "s", max_records=None).records == 10


def test_markdown_table(known: Store) -> None:
    text = coverage_markdown(profile_store(known, "k"))
    lines = text.splitlines()
    assert lines[:4] == ["| field | coverage | distinct values |", "|---|---|---|",
                         "| id | `████████··` 75.0% | 3 distinct |",
                         "| date | `█████·····` 50.0% | 2 distinct |"]
    assert "| abstract | `███·······` 25.0% | long values |" in lines
    assert "| types.specific | `··········` 0% | 0 distinct |" in lines
    assert "All 4 live records." in text


def test_bar() -> None:
    assert bar(1.0) == "██████████"
    assert bar(0.0) == "··········"
    assert bar(0.001) == "▏·········"
    assert bar(0.96) == "██████████"


# -- the command ---------------------------------------------------------------------------


def test_cli_json(run, known: Store) -> None:  # noqa: ANN001
    add_harvester("k", "http://127.0.0.1:9/oai")
    r: Result = run("profile", "k", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["coverage"] == profile_store(known, "k").coverage()
    assert data["coverage"]["abstract"] == 0.25 and data["records"] == 4
    assert list(data) == ["coverage", "records", "distinct", "live", "sampled",
                          "fields_dropped"]
    assert data["distinct"]["title"] == 2


def test_cli_table(run, known: Store) -> None:  # noqa: ANN001
    add_harvester("k", "http://127.0.0.1:9/oai")
    r = run("profile", "k")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["field", "coverage", "share", "distinct"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:-1]}
    assert rows["title"] == ["█████·····", "50.0%", "2"]
    assert rows["abstract"] == ["███·······", "25.0%", "long"]
    assert rows["types.specific"] == ["··········", "0%", "0"]
    assert list(rows) == list(profile_store(known, "k").coverage())
    assert lines[-1] == "All 4 live records."


def test_cli_sample(run, database_url: str) -> None:  # noqa: ANN001
    store = Store(db.get_engine(database_url))
    write_page(store, "s", [rec(f"oai:s:{i}") for i in range(5)], run_id="r",
               transform=title_of)
    add_harvester("s", "http://127.0.0.1:9/oai")
    data = json.loads(run("profile", "s", "--json", "--max-records", "2").out)
    assert (data["records"], data["live"], data["sampled"]) == (2, 5, True)
    assert json.loads(run("profile", "s", "--json", "--max-records", "0").out)["records"] == 5


def test_cli_empty_and_unknown(run, sqlite_url: str) -> None:  # noqa: ANN001
    add_harvester("e", "http://127.0.0.1:9/oai")
    assert json.loads(run("profile", "e", "--json").out) == {
        "coverage": {}, "records": 0, "distinct": {}, "live": 0, "sampled": False,
        "fields_dropped": 0}
    assert run("profile", "e").out == "no live records of e\n"
    r = run("profile", "nosuch")
    assert r.code == 1 and r.out == ""
    assert "nosuch" in r.error_line
    assert run("profile", "e", "--max-records", "-1").code == 2


def test_cli_default_matches_module() -> None:
    from oaipmh_dagster.cli.commands import profile

    option = next(p for p in profile.params if p.name == "max_records")
    assert option.default == MAX_RECORDS


# -- the records asset ---------------------------------------------------------------------


def test_records_materialization_carries_coverage(sqlite_url: str,
                                                  instance: dg.DagsterInstance) -> None:
    from oaipmh_dagster.demo.dataset import make_dataset
    from oaipmh_dagster_tests.defs.test_job import _mat, _run
    from oaipmh_dagster_tests.oaiserver import FaultyOAIServer

    ds = make_dataset(120, seed=5)
    with FaultyOAIServer(ds, page_size=50) as srv:
        h = add_harvester("p", srv.base_url)
        result = _run(h, instance)
    assert result.success
    meta = _mat(result, "records").metadata
    expected = profile_store(Store(), "p")
    assert expected.records == sum(1 for r in ds if not r.deleted)
    assert meta["coverage"].value == expected.coverage()
    assert meta["coverage"].value["title"] == 1.0
    table = meta["coverage_table"].value
    assert table.startswith("| field | coverage | distinct values |")
    assert "| title | `██████████` 100% |" in table
    assert meta["coverage_note"].value == f"All {expected.records} live records."


def test_coverage_carried_over_when_a_run_changes_nothing(sqlite_url: str,
                                                          instance: dg.DagsterInstance) -> None:
    """A run that wrote no record carries the previous materialization's coverage (and
    names the run that profiled); one that changed a record, or found another live count,
    profiles again."""
    from oaipmh_dagster.demo.dataset import make_dataset
    from oaipmh_dagster_tests.defs.test_job import _mat, _run
    from oaipmh_dagster_tests.oaiserver import FaultyOAIServer

    ds = make_dataset(60, seed=3)
    with FaultyOAIServer(ds, page_size=50) as srv:
        h = add_harvester("c", srv.base_url)
        first = _run(h, instance)
        again = _run(h, instance, {"full": True})  # every record unchanged
        live = next(r.identifier for r in ds if not r.deleted)
        ds.delete(live)
        changed = _run(h, instance)
    assert first.success and again.success and changed.success
    meta = [_mat(r, "records").metadata for r in (first, again, changed)]
    assert meta[0]["coverage_run"].value == first.run_id
    assert meta[1]["coverage_run"].value == first.run_id
    assert meta[1]["coverage"].value == meta[0]["coverage"].value
    assert meta[1]["coverage_table"].value == meta[0]["coverage_table"].value
    assert meta[2]["coverage_run"].value == changed.run_id
    assert meta[2]["dagster/row_count"].value == meta[0]["dagster/row_count"].value - 1


def test_carried_coverage_needs_the_same_live_count() -> None:
    from oaipmh_dagster.defs.assets import _carried_coverage

    previous = {"dagster/row_count": dg.MetadataValue.int(5), "coverage": 1,
                "coverage_table": 2, "coverage_note": 3, "coverage_run": "r"}
    assert _carried_coverage(previous, 5) == {"coverage": 1, "coverage_table": 2,
                                              "coverage_note": 3, "coverage_run": "r"}
    assert _carried_coverage(previous, 4) is None
    del previous["coverage_run"]  # written before coverage_run existed
    assert _carried_coverage(previous, 5) is None
    assert _carried_coverage(None, 5) is None


def test_records_asset_profiles_a_sample_past_its_cap(sqlite_url: str, instance: dg.DagsterInstance,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The records asset samples past ASSET_MAX_RECORDS (the CLI's cap stays MAX_RECORDS)."""
    from oaipmh_dagster.demo.dataset import make_dataset
    from oaipmh_dagster.operations import profile
    from oaipmh_dagster_tests.defs.test_job import _mat, _run
    from oaipmh_dagster_tests.oaiserver import FaultyOAIServer

    monkeypatch.setattr(profile, "ASSET_MAX_RECORDS", 40)
    ds = make_dataset(120, seed=5)
    with FaultyOAIServer(ds, page_size=50) as srv:
        h = add_harvester("s", srv.base_url)
        result = _run(h, instance)
    assert result.success
    meta = _mat(result, "records").metadata
    live = sum(1 for r in ds if not r.deleted)
    sampled = profile_store(Store(), "s", max_records=40)
    assert sampled.sampled and sampled.records < live
    assert meta["coverage"].value == sampled.coverage()
    assert meta["coverage_note"].value.startswith(f"A sample: {sampled.records} of {live}")
    assert profile_store(Store(), "s").records == live  # the default cap holds them all
