"""The record table partitioned by harvester on PostgreSQL (migration 0010,
storage/partitions.py): each harvester's rows in a table of its own, made before its
first page, emptied and dropped on removal; the migration keeps every record and
checkpoint both ways. SQLite keeps its one table."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from oaipmh_dagster.storage import db, partitions
from oaipmh_dagster.storage.store import Store

WHEN = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
pg = pytest.mark.postgres


def row(harvester_id: str, identifier: str) -> dict[str, Any]:
    return {
        "harvester_id": harvester_id, "oai_identifier": identifier,
        "datestamp": "2024-01-02T03:04:05Z", "deleted": False, "sets": json.dumps(["s"]),
        "raw_xml": f"<x>{identifier}</x>", "metadata": json.dumps({"title": identifier}),
        "errors": "[]", "harvested_at": WHEN, "run_id": "r1", "transformed_at": WHEN,
        "content_hash": "d",
    }


def put(store: Store, harvester_id: str, n: int, checkpoint: dict | None = None) -> None:
    with store.page(harvester_id, None, checkpoint) as page:
        page.upsert([row(harvester_id, f"oai:{harvester_id}:{i}") for i in range(n)])


def attached(engine: sa.Engine) -> dict[str, str]:
    """partition table -> its bound, of oaipmh_record."""
    with engine.connect() as conn:
        return dict(conn.execute(sa.text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'oaipmh_record'::regclass")).all())


def in_table(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql(f'SELECT count(*) FROM "{table}"').scalar_one())  # noqa: S608


@pytest.fixture
def pg_engine(postgres_url: str) -> Iterator[sa.Engine]:
    yield db.get_engine(postgres_url)


# -- names ----------------------------------------------------------------------------


def test_partition_names_fit_postgres_and_never_collide() -> None:
    ids = ["a", "x" * 48, "zenodo_2024", "A", "with space", 'q"uote', "é" * 48, "x" * 300,
           "default", "_default", "h" + "0" * 40]
    names = [partitions.partition_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    assert all(len(n.encode()) <= 63 for n in names)
    assert partitions.DEFAULT_PARTITION not in names
    assert partitions.partition_name("zenodo_2024") == "oaipmh_record_zenodo_2024"


# -- writes and removal -----------------------------------------------------------------


@pg
def test_a_page_goes_to_the_harvesters_own_partition(pg_engine: sa.Engine) -> None:
    store = Store(pg_engine)
    put(store, "one", 3)
    put(store, "two", 2)
    found = attached(pg_engine)
    assert found["oaipmh_record_one"] == "FOR VALUES IN ('one')"
    assert found["oaipmh_record_two"] == "FOR VALUES IN ('two')"
    assert found[partitions.DEFAULT_PARTITION] == "DEFAULT"
    assert in_table(pg_engine, "oaipmh_record_one") == 3
    assert in_table(pg_engine, partitions.DEFAULT_PARTITION) == 0
    assert store.count("one") == 3 and store.count("two") == 2


@pg
def test_a_partition_keeps_compression_and_storage_settings(pg_engine: sa.Engine) -> None:
    put(Store(pg_engine), "one", 1)
    with pg_engine.connect() as conn:
        methods = dict(conn.execute(sa.text(
            "SELECT attname, attcompression FROM pg_attribute WHERE attrelid = "
            "'oaipmh_record_one'::regclass AND attname IN ('raw_xml', 'metadata')")).all())
        options = conn.execute(sa.text(
            "SELECT reloptions FROM pg_class WHERE oid = 'oaipmh_record_one'::regclass")).scalar()
        indexes = conn.execute(sa.text(
            "SELECT count(*) FROM pg_index WHERE indrelid = 'oaipmh_record_one'::regclass"
        )).scalar()
    assert methods == {"raw_xml": "l", "metadata": "l"}
    assert set(options) == {f"{k}={v}" for k, v in partitions.PARTITION_OPTIONS}
    # Every index of the parent: the key, datestamp, and serve's change-time order (0013).
    assert indexes == 3


@pg
def test_the_benchmarks_generated_records_fill_a_partition_at_head(
        pg_engine: sa.Engine) -> None:
    """Cases 15 and 16 generate their stores in SQL with every column of the record
    table: a column added by a migration must not break them."""
    from benchmarks.store_scale import fill

    fill(pg_engine, "generated", 25)
    store = Store(pg_engine)
    assert store.counts("generated") == {"total": 25, "live": 24, "deleted": 1, "failed": 0}
    assert attached(pg_engine)[partitions.partition_name("generated")]


@pg
def test_any_harvester_id_gets_a_partition(pg_engine: sa.Engine) -> None:
    store = Store(pg_engine)
    odd = ['Q"uote; DROP TABLE x', "é" * 48, "x" * 48]
    for harvester_id in odd:
        put(store, harvester_id, 2)
    assert len(attached(pg_engine)) == len(odd) + 1
    for harvester_id in odd:
        assert store.count(harvester_id) == 2
        assert store.delete_harvester_records(harvester_id) == 2
    assert list(attached(pg_engine)) == [partitions.DEFAULT_PARTITION]


@pg
def test_removal_drops_the_partition_and_keeps_the_others(pg_engine: sa.Engine) -> None:
    store = Store(pg_engine)
    put(store, "gone", 5, checkpoint={"token": "t"})
    put(store, "kept", 4)
    assert store.delete_harvester_records("gone") == 5
    assert "oaipmh_record_gone" not in attached(pg_engine)
    with pg_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT to_regclass('oaipmh_record_gone')")).scalar() is None
    assert store.state("gone") is None
    assert store.count("kept") == 4 and store.count("gone") == 0
    put(store, "gone", 1)  # the id comes back: a new partition
    assert store.count("gone") == 1 and "oaipmh_record_gone" in attached(pg_engine)


@pg
def test_removal_does_not_wait_for_readers_of_other_harvesters(pg_engine: sa.Engine) -> None:
    """A long read of another harvester holds a lock on `oaipmh_record`: the records are
    gone at once (TRUNCATE locks the one partition); the emptied partition stays."""
    store = Store(pg_engine)
    put(store, "gone", 5)
    put(store, "busy", 2)
    with pg_engine.connect() as reader:
        reader.execute(sa.text("SELECT count(*) FROM oaipmh_record WHERE harvester_id = 'busy'"))
        assert store.delete_harvester_records("gone") == 5
        assert in_table(pg_engine, "oaipmh_record_gone") == 0
        reader.rollback()
    put(store, "gone", 2)  # the empty partition is used again
    assert store.count("gone") == 2


@pg
def test_rows_in_the_default_partition_move_into_a_new_partition(
        pg_engine: sa.Engine) -> None:
    """Rows written while a partition could not be made (or by an older process) live in
    the DEFAULT partition until the harvester's partition is made."""
    with pg_engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO oaipmh_record (harvester_id, oai_identifier, datestamp, deleted, "
            "sets, errors, harvested_at) VALUES ('late', 'oai:late:old', '2020', false, "
            "'[]', '[]', now())"))
    assert in_table(pg_engine, partitions.DEFAULT_PARTITION) == 1
    store = Store(pg_engine)
    put(store, "late", 2)
    assert in_table(pg_engine, partitions.DEFAULT_PARTITION) == 0
    assert in_table(pg_engine, "oaipmh_record_late") == 3


@pg
def test_a_busy_table_sends_the_first_pages_to_the_default_partition(
        pg_engine: sa.Engine) -> None:
    """While the partition cannot be attached (a lock held elsewhere, past the
    `lock_timeout`), pages go to the DEFAULT partition; a later store makes the
    partition and moves them."""
    with pg_engine.connect() as holder:
        holder.exec_driver_sql("LOCK TABLE oaipmh_record IN SHARE UPDATE EXCLUSIVE MODE")
        put(Store(pg_engine), "waits", 3)
        holder.rollback()
    assert in_table(pg_engine, partitions.DEFAULT_PARTITION) == 3
    assert "oaipmh_record_waits" not in attached(pg_engine)
    store = Store(pg_engine)
    put(store, "waits", 1)
    assert in_table(pg_engine, "oaipmh_record_waits") == 3
    assert in_table(pg_engine, partitions.DEFAULT_PARTITION) == 0
    assert store.delete_harvester_records("waits") == 3


@pg
def test_concurrent_first_pages_make_one_partition(pg_engine: sa.Engine) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def first(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            with Store(pg_engine).page("same", None) as page:
                page.upsert([row("same", f"oai:{i}")])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=first, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert list(attached(pg_engine)).count("oaipmh_record_same") == 1
    assert in_table(pg_engine, "oaipmh_record_same") == 4


# -- migration 0010 -----------------------------------------------------------------------


COLUMNS_0009 = ("harvester_id", "oai_identifier", "datestamp", "deleted", "sets", "raw_xml",
                "metadata", "errors", "harvested_at", "run_id", "transformed_at",
                "content_hash")


def _fill_0009(engine: sa.Engine) -> dict[str, Any]:
    """Records of three harvesters and a checkpoint at revision 0009."""
    db.upgrade(engine, "0009")
    store = Store(engine)
    for harvester_id, n in (("alpha", 30), ("beta", 7), ('odd "id"', 3)):
        rows = [row(harvester_id, f"oai:{harvester_id}:{i}") for i in range(n)]
        with engine.begin() as conn:  # 0009's columns: today's Store writes more
            conn.execute(sa.text(
                f"INSERT INTO oaipmh_record ({', '.join(COLUMNS_0009)}) "  # noqa: S608
                f"VALUES ({', '.join(':' + c for c in COLUMNS_0009)})"),
                [{c: r[c] for c in COLUMNS_0009} for r in rows])
    store.acquire("alpha", "run-1", wait=False)
    store.save_checkpoint("alpha", "run-1", {"token": "resume-here", "page": 3})
    store.release("alpha", "run-1", succeeded=False)  # a failed run keeps its checkpoint
    return _contents(engine)


def _contents(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        records = sorted(tuple(str(v) for v in r) for r in conn.execute(sa.text(
            f"SELECT {', '.join(COLUMNS_0009)} FROM oaipmh_record "  # noqa: S608
            "ORDER BY harvester_id, oai_identifier")).all())
        states = conn.execute(sa.text(
            "SELECT harvester_id, run_id, status, checkpoint FROM oaipmh_harvest_state "
            "ORDER BY harvester_id")).all()
    return {"records": records, "states": [tuple(s) for s in states]}


@pg
def test_upgrade_from_0009_keeps_every_record_and_checkpoint(pg_database: str) -> None:
    from oaipmh_dagster_tests.conftest import _clean_postgres

    db.dispose_all()
    _clean_postgres(pg_database)
    engine = db.get_engine(pg_database, migrate=False)
    before = _fill_0009(engine)
    assert len(before["records"]) == 40 and before["states"][0][3]["token"] == "resume-here"
    assert db.upgrade(engine) == db.HEAD_REVISION
    assert _contents(engine) == before
    found = attached(engine)
    assert {"oaipmh_record_alpha", "oaipmh_record_beta",
            partitions.partition_name('odd "id"'), partitions.DEFAULT_PARTITION} == set(found)
    assert in_table(engine, "oaipmh_record_alpha") == 30
    assert in_table(engine, partitions.DEFAULT_PARTITION) == 0
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT to_regclass('oaipmh_record_0009')")).scalar() is None
    # the store works on it: writes, and a removal drops one partition
    store = Store(engine)
    put(store, "beta", 9)
    assert store.count("beta") == 9
    assert store.delete_harvester_records("beta") == 9
    assert store.count("alpha") == 30
    db.dispose_all()


@pg
def test_downgrade_to_0009_keeps_every_record(pg_database: str) -> None:
    from alembic import command

    from oaipmh_dagster_tests.conftest import _clean_postgres

    db.dispose_all()
    _clean_postgres(pg_database)
    engine = db.get_engine(pg_database, migrate=False)
    before = _fill_0009(engine)
    db.upgrade(engine)
    with engine.begin() as conn:
        command.downgrade(db._alembic_config(conn), "0009")
    assert _contents(engine) == before
    with engine.connect() as conn:
        kind, options = conn.execute(sa.text(
            "SELECT relkind, reloptions FROM pg_class WHERE oid = 'oaipmh_record'::regclass"
        )).one()
        tables = conn.execute(sa.text(
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'oaipmh\\_record\\_%' "
            "AND relkind IN ('r', 'p')")).scalar()
    assert kind == "r" and options == ["toast_tuple_target=256"] and tables == 0
    assert db.upgrade(engine) == db.HEAD_REVISION  # and up again
    assert _contents(engine) == before
    db.dispose_all()


def test_sqlite_keeps_one_table_through_0010(sqlite_url: str) -> None:
    engine = db.get_engine(sqlite_url, migrate=False)
    before = _fill_0009(engine)
    assert db.upgrade(engine) == db.HEAD_REVISION
    assert _contents(engine) == before
    assert sa.inspect(engine).get_table_names().count("oaipmh_record") == 1
    store = Store(engine)
    assert store.delete_harvester_records("alpha") == 30
    assert store.count("beta") == 7


@pg
def test_a_harvest_that_rewrote_its_partition_vacuums_it(pg_engine: sa.Engine) -> None:
    """Full re-harvests that change every record: each ends with a VACUUM of the
    harvester's partition, so the next one reuses the old versions' space and the heap
    stays near twice its size instead of growing by a copy each time."""
    store = Store(pg_engine)

    def harvest(version: int) -> int:
        store.acquire("churn", f"run-{version}", wait=False)
        for start in range(0, 3000, 500):
            with store.page("churn", f"run-{version}") as page:
                ids = [f"oai:churn:{i}" for i in range(start, start + 500)]
                page.hashes(ids)
                page.upsert([{**row("churn", i), "datestamp": f"2024-01-0{version + 1}",
                              "raw_xml": f"<x>{i} {version}</x>" * 20} for i in ids])
        store.release("churn", f"run-{version}", succeeded=True)
        with pg_engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT pg_relation_size('oaipmh_record_churn')")).scalar_one())

    first = harvest(0)
    sizes = [harvest(v) for v in range(1, 5)]
    assert sizes[-1] <= 2.3 * first, (first, sizes)
    with pg_engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = "
            "'oaipmh_record_churn'")).scalar_one() >= 1


@pg
def test_a_first_harvest_analyzes_the_partition_it_filled(pg_engine: sa.Engine) -> None:
    """Before its first ANALYZE the planner sorted a whole partition for one page of its
    list: the release of a first harvest analyzes the partition it filled, once."""
    store = Store(pg_engine)

    def reltuples() -> float:
        with pg_engine.connect() as conn:
            return float(conn.execute(sa.text(
                "SELECT reltuples FROM pg_class WHERE relname = 'oaipmh_record_fresh'"
            )).scalar_one())

    store.acquire("fresh", "r1", wait=False)
    put(store, "fresh", 2000)
    assert reltuples() < 0  # never analyzed
    store.release("fresh", "r1", succeeded=True)
    assert reltuples() == 2000
    store.acquire("fresh", "r2", wait=False)
    with store.page("fresh", None) as page:  # new records only: no vacuum either
        page.upsert([row("fresh", f"oai:fresh:{i}") for i in range(2000, 2500)])
    store.release("fresh", "r2", succeeded=True)
    assert reltuples() == 2000  # the next harvests leave it to autovacuum
    assert not partitions.analyze_if_new(pg_engine, "fresh")


@pg
def test_harvests_that_rewrite_every_record_vacuum_the_partition(postgres_url: str) -> None:
    """On `harvest()`'s own road, where a page's hashes are read before its transaction,
    the rows a page replaces are still counted, so the release vacuums a partition that a
    harvest rewrote (a changed transformer rewrites every record here)."""
    from oaipmh_dagster.demo.dataset import make_dataset
    from oaipmh_dagster.harvesting.harvest import harvest
    from oaipmh_dagster.oai import ClientOptions
    from oaipmh_dagster.storage.registry import Harvester
    from oaipmh_dagster_tests.oaiserver import OAIServer

    store = Store()
    with OAIServer(make_dataset(3000, seed=5), page_size=500) as srv:
        for i, transformer in enumerate(["oai_dc", "xml", "oai_dc"]):
            h = Harvester(id="churn", base_url=srv.base_url, metadata_prefix="oai_dc",
                          transformer=transformer)
            stats = harvest(h, store, run_id=f"r{i}", options=ClientOptions(read_timeout=5))
            assert stats.new + stats.updated + stats.deleted == 3000 and bool(stats.updated) == bool(i)
    with store.engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = "
            "'oaipmh_record_churn'")).scalar_one() >= 2


def _indexes(engine: sa.Engine, table: str) -> set[str]:
    """The column lists of `table`'s indexes."""
    with engine.connect() as conn:
        return {d.split(" USING btree ")[1] for d in conn.execute(sa.text(
            "SELECT indexdef FROM pg_indexes WHERE tablename = :t"), {"t": table}).scalars()}


@pg
def test_one_harvesters_list_reads_the_change_index_in_order(pg_engine: sa.Engine) -> None:
    """0013 leaves a partition three indexes (no second list index: in a partition of
    one harvester, (harvested_at, harvester_id, oai_identifier) is already its order),
    and a page of one harvester's list deep in it is a range scan of that index, with
    no sort."""
    from datetime import timedelta

    from oaipmh_dagster.serve import queries as q

    store = Store(pg_engine)
    for hid in ("alpha", "beta"):  # first harvests: their release analyzes the partition
        store.acquire(hid, "r1", wait=False)
        with store.page(hid, None) as page:
            page.upsert([{**row(hid, f"oai:{hid}:{i:05d}"),
                          "harvested_at": WHEN + timedelta(seconds=i // 3)}
                         for i in range(3000)])
        store.release(hid, "r1", succeeded=True)
    table = partitions.partition_name("alpha")
    assert _indexes(pg_engine, table) == {
        "(harvester_id, oai_identifier)", "(harvester_id, datestamp)",
        "(harvested_at, harvester_id, oai_identifier)"}
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        seen.append((statement, params))

    sel = q.Selection(("alpha",), None, None, WHEN + timedelta(days=1))
    after = (WHEN + timedelta(seconds=500), "alpha", "oai:alpha:01500")
    sa.event.listen(pg_engine, "before_cursor_execute", capture)
    try:
        got = q.page(pg_engine, sel, after, 50, with_raw=True)
    finally:
        sa.event.remove(pg_engine, "before_cursor_execute", capture)
    assert [r.identifier for r in got] == [f"oai:alpha:{i:05d}" for i in range(1501, 1551)]
    statement, params = next((s, p) for s, p in seen if "ORDER BY" in s)
    with pg_engine.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()
        cursor.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        plan = cursor.fetchone()[0][0]["Plan"]
        index = conn.execute(sa.text(
            "SELECT indexname FROM pg_indexes WHERE tablename = :t AND indexdef LIKE "
            "'%(harvested_at, harvester_id, oai_identifier)'"), {"t": table}).scalar_one()
    nodes, todo = [], [plan]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(node.get("Plans", []))
    assert not [n for n in nodes if "Sort" in n["Node Type"]], plan
    assert [n.get("Index Name") for n in nodes if "Index" in n["Node Type"]] == [index], plan


@pg
def test_downgrade_to_0012_builds_the_second_list_index_again(pg_database: str) -> None:
    from alembic import command

    from oaipmh_dagster_tests.conftest import _clean_postgres

    db.dispose_all()
    _clean_postgres(pg_database)
    engine = db.get_engine(pg_database)
    store = Store(engine)
    put(store, "alpha", 20)
    put(store, "beta", 5)
    second = "(harvester_id, harvested_at, oai_identifier)"
    with engine.begin() as conn:
        command.downgrade(db._alembic_config(conn), "0012")
    for hid in ("alpha", "beta"):
        assert second in _indexes(engine, partitions.partition_name(hid))
    assert db.upgrade(engine) == db.HEAD_REVISION
    assert second not in _indexes(engine, partitions.partition_name("alpha"))
    assert store.count("alpha") == 20 and store.count("beta") == 5
    db.dispose_all()
