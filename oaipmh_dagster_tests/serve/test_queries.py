"""The provider's reads on PostgreSQL run as prepared statements with a generic plan
(planning a list over thousands of partitions costs seconds a page): one per
connection and statement shape, and a session that lost them, or already holds them,
behind a transaction pooler still answers."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from oaipmh_dagster.oai.models import Header, Record
from oaipmh_dagster.serve import queries as q
from oaipmh_dagster.storage import db
from oaipmh_dagster_tests.serve.conftest import dc, set_times, write

pytestmark = pytest.mark.postgres
BASE = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _prepare_every_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two harvesters stand for the thousands past `PREPARED_FROM`."""
    monkeypatch.setattr(q, "PREPARED_FROM", 2)


@pytest.fixture
def engine(postgres_url: str) -> Iterator[sa.Engine]:
    """One pooled connection, so every read meets the session the last one left."""
    main = db.get_engine(postgres_url)
    for hid in ("a", "b"):
        write(main, hid, [Record(Header(f"oai:x:{i}", "2001-01-01", ("s",) if i % 2 else ()),
                                 dc(f"{hid} {i}")) for i in range(6)])
        set_times(main, hid, {f"oai:x:{i}": BASE + timedelta(seconds=i + (hid == "b") * 6)
                              for i in range(6)})
    one = sa.create_engine(postgres_url, pool_size=1, max_overflow=0)
    yield one
    one.dispose()


def prepared(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE 'oaipmh_serve_%'"
        )).scalars())


def everything(upper: datetime) -> q.Selection:
    return q.Selection(("a", "b"), None, None, upper)


def test_pages_run_one_prepared_statement_per_shape(engine: sa.Engine) -> None:
    sel = everything(BASE + timedelta(hours=1))
    first = q.page(engine, sel, None, 4, with_raw=True)
    assert [(r.harvester_id, r.identifier) for r in first] == [
        ("a", "oai:x:0"), ("a", "oai:x:1"), ("a", "oai:x:2"), ("a", "oai:x:3")]
    after = (first[-1].harvested_at, first[-1].harvester_id, first[-1].identifier)
    rest = q.page(engine, sel, after, 100, with_raw=True)
    assert [(r.harvester_id, r.identifier) for r in rest][:3] == [
        ("a", "oai:x:4"), ("a", "oai:x:5"), ("b", "oai:x:0")]
    assert len(rest) == 8 and all(r.raw_xml for r in rest)
    again = q.page(engine, sel, after, 100, with_raw=True)
    assert again == rest
    assert q.count(engine, sel) == 12
    assert q.count(engine, q.Selection(("a", "b"), "s", None, sel.upper)) == 6
    # the first page, the keyset page, the count and the count of a set: 4 shapes
    assert len(prepared(engine)) == 4


def test_a_list_of_few_harvesters_is_planned_with_their_partitions_only(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(q, "PREPARED_FROM", 3)
    sel = everything(BASE + timedelta(hours=1))
    assert len(q.page(engine, sel, None, 100, with_raw=False)) == 12
    assert q.count(engine, q.Selection(("b",), "s", None, sel.upper)) == 3
    assert prepared(engine) == []


def test_a_session_that_lost_its_statements_prepares_them_again(engine: sa.Engine) -> None:
    sel = everything(BASE + timedelta(hours=1))
    assert len(q.page(engine, sel, None, 100, with_raw=False)) == 12
    with engine.connect() as conn:  # what a transaction pooler's other session looks like
        conn.execute(sa.text("DEALLOCATE ALL"))
        conn.commit()
    assert prepared(engine) == []
    assert len(q.page(engine, sel, None, 100, with_raw=False)) == 12
    assert len(prepared(engine)) == 1


def test_a_session_that_holds_them_already_runs_them(engine: sa.Engine) -> None:
    sel = everything(BASE + timedelta(hours=1))
    assert len(q.page(engine, sel, None, 100, with_raw=False)) == 12
    with engine.connect() as conn:  # this connection forgets; its session does not
        conn.connection.info.pop("oaipmh_prepared")
    assert len(q.page(engine, sel, None, 100, with_raw=False)) == 12
    assert len(prepared(engine)) == 1


def test_a_failed_read_is_sqlalchemys_error(engine: sa.Engine) -> None:
    bad = sa.select(sa.func.count()).select_from(sa.table("no_such_table"))
    sel = everything(BASE + timedelta(hours=1))
    with pytest.raises(sa.exc.ProgrammingError):
        q._rows(engine, bad, sel)
    assert len(q.page(engine, sel, None, 100, with_raw=False)) == 12
