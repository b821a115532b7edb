"""The harvester registry: the `Harvester` row, its validation rules and CRUD (both databases)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import (
    Harvester,
    HarvesterExists,
    HarvesterNotFound,
    InvalidHarvester,
    InvalidRow,
    Registry,
    default_transformer,
)

URL = "https://repo.example.org/oai"

# The stable JSON form of a harvester (`harvester show --json`, reconstruction metadata).
JSON_KEYS = {
    "id", "base_url", "metadata_prefix", "name", "sets", "transformer", "cron", "timezone",
    "enabled", "comment", "timeout", "delay", "max_parallel", "max_retries", "auth_env",
    "overlap", "reconcile_every", "schema", "max_delete", "created", "updated",
}


def make(**changes) -> Harvester:
    values = {"id": "zenodo", "base_url": URL, "metadata_prefix": "oai_dc"}
    values.update(changes)
    return Harvester(**values)


@pytest.fixture
def registry(database_url: str) -> Registry:
    return Registry(db.get_engine(database_url))


# -- the dataclass -------------------------------------------------------------------


def test_defaults_fill_name_and_transformer() -> None:
    h = make(metadata_prefix="oai_datacite")
    assert h.name == "zenodo"
    assert h.transformer == "datacite"
    assert h.sets == ()
    assert h.timezone == "UTC" and h.enabled and h.cron is None
    assert h.job_name == "harvest_oaipmh_records_zenodo"
    assert make(base_url="https://Repo.Example.org:8443/oai").host == "repo.example.org:8443"


@pytest.mark.parametrize(("prefix", "expected"), [
    ("oai_dc", "oai_dc"), ("datacite", "datacite"), ("datacite4", "datacite"),
    ("marc21", "marc21"), ("MARCXML", "marc21"), ("mods", "mods"), ("oai_qdc", "qdc"),
    ("oai_openaire", "oai_openaire"), ("rdf", "xml"),
])
def test_default_transformer(prefix: str, expected: str) -> None:
    assert default_transformer(prefix) == expected


@pytest.mark.parametrize("good", ["a", "0", "zenodo", "z_1", "a" * 48, "9lives", "a__b"])
def test_valid_ids(good: str) -> None:
    assert make(id=good).id == good


@pytest.mark.parametrize("bad", [
    "", "_a", "A", "Zenodo", "a-b", "a.b", "a b", "a" * 49, "é", "a\n", "a/b", "ab:c",
])
def test_invalid_ids(bad: str) -> None:
    with pytest.raises(InvalidHarvester, match="invalid harvester id"):
        make(id=bad)


@pytest.mark.parametrize("good", [
    "http://x.org/oai", "https://x.org/oai?a=b", "https://127.0.0.1:8080/oai",
    "https://[::1]/oai",
])
def test_valid_urls(good: str) -> None:
    assert make(base_url=good).base_url == good


@pytest.mark.parametrize(("bad", "why"), [
    ("ftp://x.org/oai", "scheme must be http or https"),
    ("file:///etc/passwd", "scheme"),
    ("x.org/oai", "scheme"),
    ("", "scheme"),
    ("https:///oai", "no host"),
    ("https://user:pw@x.org/oai", "credentials"),
    ("https://user@x.org/oai", "credentials"),
    ("https://x.org/oai#top", "fragment"),
    ("https://x.org/oai#", "fragment"),
    ("https://x.org/o ai", "whitespace"),
    ("https://x.org:99999/oai", "invalid base URL"),
    ("https://x.org:abc/oai", "invalid base URL"),
])
def test_invalid_urls(bad: str, why: str) -> None:
    with pytest.raises(InvalidHarvester, match=why):
        make(base_url=bad)


def test_credentials_are_not_echoed() -> None:
    with pytest.raises(InvalidHarvester) as err:
        make(base_url="https://alice:s3cret@x.org/oai")
    assert "s3cret" not in str(err.value)
    assert "--auth-env" in str(err.value)


@pytest.mark.parametrize("bad", ["", "oai dc", "oai/dc", "dc<", "a,b", "oai_dc\n"])
def test_invalid_prefix(bad: str) -> None:
    with pytest.raises(InvalidHarvester, match="metadata prefix"):
        make(metadata_prefix=bad)


def test_valid_sets() -> None:
    h = make(sets=["physics", "physics:hep", "a-b_c.d!~*'()"])
    assert h.sets == ("physics", "physics:hep", "a-b_c.d!~*'()")


@pytest.mark.parametrize("bad", [[""], ["a b"], [":a"], ["a:"], ["a::b"], ["a/b"], [1], ["a\n"]])
def test_invalid_sets(bad: list) -> None:
    with pytest.raises(InvalidHarvester, match="invalid set spec"):
        make(sets=bad)


def test_duplicate_set() -> None:
    with pytest.raises(InvalidHarvester, match="twice"):
        make(sets=["a", "b", "a"])


@pytest.mark.parametrize("good", ["oai_dc", "xml", "mypkg.sub:func", "_m:_f", "m:F2"])
def test_valid_transformer_syntax(good: str) -> None:
    assert make(transformer=good).transformer == good


@pytest.mark.parametrize("bad", ["Oai-DC", "a.b", "pkg:", ":f", "pkg:a.b", "1pkg:f", "a b", "xml\n"])
def test_invalid_transformer_syntax(bad: str) -> None:
    with pytest.raises(InvalidHarvester, match="invalid transformer"):
        make(transformer=bad)


@pytest.mark.parametrize("good", [None, "0 3 * * *", "*/15 * * * *", "0 0 1 1 *", "@daily",
                                  "@hourly", "@weekly", "@monthly", "@yearly", "@annually",
                                  "@midnight", "0 0 * jan-mar mon#2", "0 0 L * *"])
def test_valid_cron(good: str | None) -> None:
    assert make(cron=good).cron == good


@pytest.mark.parametrize("bad", ["", "every day", "61 * * * *", "* * * *", "0 25 * * *",
                                 "@reboot", "0 0 * * * *", "0 0 30 2 *", "*/0 * * * *"])
def test_invalid_cron(bad: str) -> None:
    with pytest.raises(InvalidHarvester, match="cron"):
        make(cron=bad)


@pytest.mark.parametrize("good", ["UTC", "Europe/Prague", "America/New_York"])
def test_valid_timezone(good: str) -> None:
    assert make(timezone=good).timezone == good


@pytest.mark.parametrize("bad", ["Mars/Olympus", "", "../etc/passwd", "Europe/"])
def test_invalid_timezone(bad: str) -> None:
    with pytest.raises(InvalidHarvester, match="timezone"):
        make(timezone=bad)


@pytest.mark.parametrize(("field", "good", "bad"), [
    ("timeout", [0.001, 3600], [0, -1, 3600.5]),
    ("delay", [0, 600], [-0.1, 601]),
    ("max_parallel", [1, 32], [0, 33]),
    ("max_retries", [0, 50], [-1, 51]),
])
def test_numeric_bounds(field: str, good: list, bad: list) -> None:
    for value in good:
        assert getattr(make(**{field: value}), field) == value
    for value in bad:
        with pytest.raises(InvalidHarvester, match=field):
            make(**{field: value})


@pytest.mark.parametrize("good", [None, "OAIPMH_AUTH_TOKEN", "OAIPMH_AUTH_x", "OAIPMH_AUTH_1"])
def test_valid_auth_env(good: str | None) -> None:
    assert make(auth_env=good).auth_env == good


@pytest.mark.parametrize("bad", ["", "1ABC", "A-B", "A B", "$TOKEN", "user:pass", "TOKEN\n"])
def test_invalid_auth_env(bad: str) -> None:
    with pytest.raises(InvalidHarvester, match="environment variable"):
        make(auth_env=bad)


def test_name_too_long() -> None:
    with pytest.raises(InvalidHarvester, match="name"):
        make(name="n" * 256)
    assert make(name="n" * 255).name == "n" * 255


def test_replace_validates() -> None:
    h = make()
    assert h.replace(cron="0 * * * *").cron == "0 * * * *"
    with pytest.raises(InvalidHarvester):
        h.replace(base_url="ftp://x.org/")


def test_to_dict_keys_and_round_trip() -> None:
    when = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    h = make(sets=["a", "b:c"], cron="0 3 * * *", timezone="Europe/Prague", enabled=False,
             comment="hi", timeout=30.0, delay=1.5, max_parallel=2, max_retries=3,
             auth_env="OAIPMH_AUTH_TOKEN", created=when, updated=when)
    data = h.to_dict()
    assert set(data) == JSON_KEYS
    assert data["sets"] == ["a", "b:c"]
    assert data["created"] == "2024-05-06T07:08:09Z"
    assert json.loads(json.dumps(data)) == data  # plain JSON
    back = Harvester.from_dict(json.loads(json.dumps(data)))
    assert back == h
    assert back.created == when and back.updated == when


def test_to_dict_without_times() -> None:
    data = make().to_dict()
    assert data["created"] is None and data["updated"] is None
    assert Harvester.from_dict(data) == make()


def test_from_dict_ignores_unknown_keys_and_validates() -> None:
    data = make().to_dict() | {"extra": 1}
    assert Harvester.from_dict(data).id == "zenodo"
    with pytest.raises(InvalidHarvester):
        Harvester.from_dict(data | {"cron": "nope"})
    with pytest.raises(InvalidHarvester):
        Harvester.from_dict(data | {"sets": "abc"})  # a string is not a list of sets


# -- CRUD on both databases ----------------------------------------------------------


def test_add_get_list(registry: Registry) -> None:
    assert registry.list() == []
    added = registry.add(make(sets=["a"], cron="0 3 * * *"))
    assert added.created is not None and added.created == added.updated
    registry.add(make(id="arxiv", base_url="http://export.arxiv.org/oai2"))
    got = registry.get("zenodo")
    assert got == added
    assert got.sets == ("a",)
    assert got.created == added.created
    assert got.created.tzinfo is not None
    assert [h.id for h in registry.list()] == ["arxiv", "zenodo"]
    assert registry.list_rows() == registry.list()


def test_duplicate_id(registry: Registry) -> None:
    registry.add(make())
    with pytest.raises(HarvesterExists, match="zenodo"):
        registry.add(make(base_url="https://other.org/oai"))
    assert registry.get("zenodo").base_url == URL


def test_not_found(registry: Registry) -> None:
    with pytest.raises(HarvesterNotFound):
        registry.get("nope")
    with pytest.raises(HarvesterNotFound):
        registry.update("nope", cron="0 * * * *")
    with pytest.raises(HarvesterNotFound):
        registry.remove("nope")


def test_update(registry: Registry) -> None:
    added = registry.add(make())
    new = registry.update("zenodo", cron="*/5 * * * *", sets=("x", "y"), enabled=False)
    assert new.cron == "*/5 * * * *" and new.sets == ("x", "y") and not new.enabled
    got = registry.get("zenodo")
    assert got == new
    assert got.created == added.created
    assert got.updated >= added.updated
    registry.update("zenodo", cron=None, sets=())
    assert registry.get("zenodo").cron is None
    assert registry.get("zenodo").sets == ()


def test_update_validates_and_changes_nothing(registry: Registry) -> None:
    registry.add(make())
    with pytest.raises(InvalidHarvester):
        registry.update("zenodo", base_url="ftp://x.org/oai")
    with pytest.raises(InvalidHarvester):
        registry.update("zenodo", timezone="Nowhere/Land")
    with pytest.raises(InvalidHarvester, match="cannot change"):
        registry.update("zenodo", id="other")
    assert registry.get("zenodo").base_url == URL
    assert registry.get("zenodo").timezone == "UTC"


def test_remove(registry: Registry) -> None:
    registry.add(make())
    registry.add(make(id="other"))
    registry.remove("zenodo")
    with pytest.raises(HarvesterNotFound):
        registry.get("zenodo")
    assert [h.id for h in registry.list()] == ["other"]


def _hand_edit(url: str, sql: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(sql))
    engine.dispose()


@pytest.mark.parametrize("edit", [
    "cron = 'every full moon'",
    "base_url = 'ftp://x.org/oai'",
    "timezone = 'Mars/Olympus'",
    "max_parallel = 0",
    "id = 'Bad-Id'",
])
def test_list_rows_reports_invalid_row(registry: Registry, database_url: str, edit: str) -> None:
    registry.add(make(id="good_a"))
    registry.add(make(id="broken"))
    registry.add(make(id="good_z"))
    _hand_edit(database_url, f"UPDATE oaipmh_harvester SET {edit} WHERE id = 'broken'")  # noqa: S608
    rows = registry.list_rows()
    assert len(rows) == 3
    invalid = [r for r in rows if isinstance(r, InvalidRow)]
    assert len(invalid) == 1 and invalid[0].error
    assert invalid[0].id in ("broken", "Bad-Id")
    assert [h.id for h in registry.list()] == ["good_a", "good_z"]
    if invalid[0].id == "broken":
        with pytest.raises(InvalidHarvester, match="broken"):
            registry.get("broken")
        registry.remove("broken")  # an invalid row can still be removed
        assert len(registry.list_rows()) == 2


def test_list_rows_survives_undecodable_values(sqlite_url: str) -> None:
    """SQLite lets a hand edit store text that the JSON/date columns cannot read."""
    registry = Registry(db.get_engine(sqlite_url))
    registry.add(make(id="good_a"))
    registry.add(make(id="broken"))
    registry.add(make(id="broken_date"))
    registry.add(make(id="good_z"))
    _hand_edit(sqlite_url, "UPDATE oaipmh_harvester SET sets = 'not json' WHERE id = 'broken'")
    _hand_edit(sqlite_url,
               "UPDATE oaipmh_harvester SET created = 'garbage' WHERE id = 'broken_date'")
    rows = registry.list_rows()
    assert [r.id for r in rows] == ["broken", "broken_date", "good_a", "good_z"]
    assert [type(r) for r in rows] == [InvalidRow, InvalidRow, Harvester, Harvester]
    assert [h.id for h in registry.list()] == ["good_a", "good_z"]
    with pytest.raises(InvalidHarvester, match="broken"):
        registry.get("broken")
    # Kept rows only, the undecodable ones among them still reported one by one.
    kept = registry.list_rows(lambda i: i in ("broken", "good_z"))
    assert [(r.id, type(r)) for r in kept] == [("broken", InvalidRow), ("good_z", Harvester)]
    assert [r.id for r in registry.list_rows(lambda i: i.startswith("good"))] == [
        "good_a", "good_z"]


def test_list_rows_keeps_rows_in_chunks_in_id_order(sqlite_url: str) -> None:
    registry = Registry(db.get_engine(sqlite_url))
    ids = [f"h{i:04d}" for i in range(1203)]
    for hid in reversed(ids):
        registry.add(make(id=hid))
    kept = registry.list_rows(lambda i: int(i[1:]) % 2 == 0)
    assert [r.id for r in kept] == ids[::2]  # 602 rows: two chunks and a part
    assert registry.list_rows(lambda i: False) == []


@pytest.mark.parametrize("changes, message", [
    ({"base_url": "https://example.org/oai?x=" + "a" * 2048}, "longer than 2048"),
    ({"metadata_prefix": "p" * 256}, "longer than 255"),
    ({"auth_env": "A" * 256}, "longer than 255"),
    ({"sets": ["s" * 256]}, "longer than 255"),
    ({"transformer": "t" * 256}, "longer than 255"),
    ({"overlap": -1}, "overlap"),
    ({"overlap": 31 * 86400}, "overlap"),
    ({"overlap": 1.5}, "overlap"),
])
def test_values_over_column_sizes_are_refused_at_input(changes: dict, message: str) -> None:
    with pytest.raises(InvalidHarvester, match=message):
        make(**changes)


def test_overlap_round_trips(registry: Registry) -> None:
    registry.add(make(overlap=3600))
    assert registry.get("zenodo").overlap == 3600
    registry.update("zenodo", overlap=None)
    assert registry.get("zenodo").overlap is None


def test_registry_errors_sit_under_the_package_root() -> None:
    from oaipmh_dagster.errors import OAIPMHDagsterError

    for cls in (InvalidHarvester, HarvesterNotFound, HarvesterExists):
        assert issubclass(cls, OAIPMHDagsterError)
    with pytest.raises(OAIPMHDagsterError, match="cron"):
        make(cron="61 * * * *")


def test_a_plain_cron_is_checked_without_importing_dagster() -> None:
    """`harvester add` with an everyday cron does not pay Dagster's import (0.8 s)."""
    code = ("import sys\nfrom oaipmh_dagster.storage.registry import validate_cron\n"
            "validate_cron('17 3 * * *'); validate_cron('*/15 * * * 1-5')\n"
            "print('dagster' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "False"


def test_the_plain_cron_check_agrees_with_dagster() -> None:
    """Every expression the shortcut accepts, Dagster accepts; what it does not know
    (names, L, #, months, odd spacing) is left to Dagster. Random plain expressions,
    in range and out of it."""
    import random

    from oaipmh_dagster.storage.registry import _plainly_valid, _valid_cron

    rng = random.Random(20261201)

    def field(low: int, high: int) -> str:
        kind = rng.choice((0, 0, 1, 2, 3, 4, 4, 5))
        def n() -> str:  # now and then just out of range
            return str(rng.randint(low - 1, high + 1) if rng.random() < 0.1
                       else rng.randint(low, high))

        if kind == 0:
            return "*"
        if kind == 1:
            return f"*/{rng.randint(0, high + 2)}"
        if kind == 2:
            return f"{n()}-{n()}"
        if kind == 3:
            return ",".join(n() for _ in range(rng.randint(2, 4)))
        if kind == 4:
            return f"0{rng.randint(0, 9)}" if rng.random() < 0.3 else n()
        return rng.choice(["L", "mon", "1#2", "?", "1/5", "", "*/"])

    ranges = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
    accepted = refused = 0
    for _ in range(3000):
        parts = [field(lo, hi) for lo, hi in ranges]
        if rng.random() < 0.7:
            parts[3] = "*"
        expr = " ".join(parts)
        if _plainly_valid(expr):
            accepted += 1
            assert _valid_cron(expr), expr
        else:
            refused += 1
    assert accepted > 500 and refused > 500  # both sides of the shortcut were exercised
    for expr in ("0 0 30 2 *", "0 0 31 2 *", "0 3 * jan *", "0  3 * * *", "0 3 * * 7",
                 "00 3 * * *", "*/0 * * * *", "5-1 * * * *", "60 * * * *"):
        assert not _plainly_valid(expr), expr
