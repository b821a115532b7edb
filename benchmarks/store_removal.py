"""Case 16: removing one harvester's records, and the size of its records after full
re-harvests, on PostgreSQL.

Removal: a store of S records of other harvesters plus N of the one removed (generated
as in case 15), `Store.delete_harvester_records` (what `harvester remove ID
--delete-records` calls) timed, while a writer commits pages of 100 records into another
harvester: its slowest page during the removal against its slowest page before says
whether the removal held up other harvesters. Done at the head (TRUNCATE + DROP of the
partition) and at 0009 (one table: a DELETE of every row) in the same run.

Size: N records written as a harvest writes them (pages of 500 through the store under a
lease, then a release), then `rewrites` full re-harvests in which every record changed
(new content and datestamp: every row rewritten), back to back: one harvester as 0010
stores it (fillfactor 85, autovacuum scale factors 0.05, a VACUUM of the partition when
a harvest that rewrote it ends) and one with PostgreSQL's defaults and no such VACUUM,
interleaved, autovacuum left to run as it would; reported: each partition's total size
(heap, TOAST, indexes) after every round against its size after the first harvest."""

from __future__ import annotations

import threading
import time
from typing import Any

from benchmarks.cases import Bench, Row, postgres_database
from benchmarks.store_scale import fill, fill_others, generated

PAGE = 500
WRITER_PAGE = 100
TARGET_SECONDS = 3.0


def _writer(engine: Any, stop: threading.Event, latencies: list[tuple[float, float]]) -> None:
    """Pages of `WRITER_PAGE` records into harvester `live` until `stop`: (start, seconds)."""
    import sqlalchemy as sa

    from oaipmh_dagster.storage import partitions

    i = 0
    with engine.connect() as conn:
        cols = ", ".join(partitions.columns(conn))
    while not stop.is_set():
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(sa.text(
                f"INSERT INTO oaipmh_record ({cols}) SELECT {cols} FROM "  # noqa: S608
                f"{generated('live', WRITER_PAGE, start=i)} ON CONFLICT (harvester_id, oai_identifier) DO UPDATE "
                "SET raw_xml = EXCLUDED.raw_xml"))
        latencies.append((t0, time.perf_counter() - t0))
        i += WRITER_PAGE
        time.sleep(0.01)




def removal(url: str, layout: str, others: int, n: int) -> dict[str, Any]:
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.store import Store

    engine = db.get_engine(url, migrate=False)
    db.upgrade(engine, layout)
    fill_others(engine, others)
    fill(engine, "gone", n)
    store = Store(engine)
    with store.page("live", None):
        pass  # its partition, before the writer starts
    stop = threading.Event()
    latencies: list[tuple[float, float]] = []
    writer = threading.Thread(target=_writer, args=(engine, stop, latencies), daemon=True)
    writer.start()
    time.sleep(3)
    t0 = time.perf_counter()
    removed = store.delete_harvester_records("gone")
    seconds = time.perf_counter() - t0
    time.sleep(1)
    stop.set()
    writer.join(timeout=30)
    assert removed == n, (removed, n)
    before = [s for start, s in latencies if start < t0]
    during = [s for start, s in latencies if t0 <= start <= t0 + seconds] or [0.0]
    # a page that began before the removal and ended during it counts as during
    during += [s for start, s in latencies if start < t0 < start + s]
    engine.dispose()
    db.dispose_all()
    return {"layout": layout, "seconds": seconds, "removed": removed,
            "writer_max_before": max(before), "writer_max_during": max(during),
            "writer_pages_during": len(during)}


def _rows(harvester_id: str, start: int, n: int, version: int) -> list[dict[str, Any]]:
    """Rows as a harvest upserts them (JSON columns as text), content of `version`."""
    import hashlib
    import json
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    out = []
    for i in range(start + 1, start + n + 1):
        digest = hashlib.md5(f"{i + version}".encode()).hexdigest()  # noqa: S324 - data
        stamp = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=i + version * 1000)
        out.append({
            "harvester_id": harvester_id, "oai_identifier": f"oai:{harvester_id}:{i:09d}",
            "datestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), "deleted": False,
            "sets": '["set_a"]',
            "raw_xml": f"<record><header><identifier>oai:x:{i}</identifier></header>"
                       f"<metadata><dc><title>{(digest + ' ') * 18}</title></dc></metadata>"
                       "</record>",
            "metadata": json.dumps({"title": digest, "creator": [digest[::-1]]}),
            "errors": "[]", "harvested_at": now, "run_id": f"v{version}",
            "transformed_at": now, "content_hash": digest})
    return out


def sizes_after_rewrites(url: str, n: int, rounds: int) -> dict[str, list[int]]:
    """Partition sizes after a first harvest and `rounds` full re-harvests changing every
    record, written as a harvest writes (pages through the store, a lease, a release):
    `tuned` as 0010 stores it, `defaults` with PostgreSQL's storage parameters and no
    VACUUM when a harvest ends (the store before 0010)."""
    import uuid

    import sqlalchemy as sa

    from oaipmh_dagster.storage import db, partitions
    from oaipmh_dagster.storage.store import Store

    engine = db.get_engine(url, migrate=False)
    db.upgrade(engine)
    store = Store(engine)
    names = ("tuned", "defaults")
    for name in names:
        with store.page(name, None):
            pass
    resets = ", ".join(k for k, _ in partitions.PARTITION_OPTIONS if k != "toast_tuple_target")
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE oaipmh_record_defaults RESET ({resets})")
    out: dict[str, list[int]] = {name: [] for name in names}
    vacuum_min = partitions.VACUUM_MIN_ROWS
    try:
        for version in range(rounds + 1):
            for name in names:
                partitions.VACUUM_MIN_ROWS = vacuum_min if name == "tuned" else 2**62
                run_id = uuid.uuid4().hex
                store.acquire(name, run_id, wait=False)
                for start in range(0, n, PAGE):
                    rows = _rows(name, start, min(PAGE, n - start), version)
                    with store.page(name, run_id) as page:
                        page.hashes([r["oai_identifier"] for r in rows])
                        page.upsert(rows)
                store.release(name, run_id, succeeded=True)
                with engine.connect() as conn:
                    out[name].append(int(conn.execute(sa.text(
                        "SELECT pg_total_relation_size(to_regclass(:t))"),
                        {"t": f"oaipmh_record_{name}"}).scalar_one()))
    finally:
        partitions.VACUUM_MIN_ROWS = vacuum_min
    engine.dispose()
    db.dispose_all()
    return out


def case_store_removal(b: Bench) -> None:
    """Case 16: removal of one harvester's records; its size after full re-harvests."""
    n, others, rounds = b.sizes.removal_records, b.sizes.removal_store, b.sizes.rewrites
    results: dict[str, Any] = {}
    for layout in ("head", "0009"):
        with postgres_database() as url:
            results[layout] = r = removal(url, layout, others, n)
        b.echo(f"    removal at {layout}: {r}")
    with postgres_database() as url:
        results["sizes"] = sizes = sizes_after_rewrites(url, n, rounds)
    b.raw["store_removal"] = results
    head, old = results["head"], results["0009"]
    b.add(Row("16", f"remove {n:,} records of one harvester from a store of {others:,} "
              "more, PostgreSQL",
              f"{head['seconds']:.2f} s (TRUNCATE + DROP of its partition); a writer's "
              f"slowest page during it {head['writer_max_during'] * 1000:.0f} ms vs "
              f"{head['writer_max_before'] * 1000:.0f} ms before",
              f"0009's DELETE: {old['seconds']:.2f} s, slowest page during it "
              f"{old['writer_max_during'] * 1000:.0f} ms vs "
              f"{old['writer_max_before'] * 1000:.0f} ms",
              f"< {TARGET_SECONDS:.0f} s", "ok" if head["seconds"] < TARGET_SECONDS else "MISS",
              values=results))
    for name, label in (("tuned", "0010 (partition settings, VACUUM when a harvest "
                                  "ends)"),
                        ("defaults", "PostgreSQL's defaults, no VACUUM at the end")):
        points = sizes[name]
        b.add(Row("16", f"size of {n:,} records after {rounds} full re-harvests that change "
                  f"every record, {label}",
                  f"x{points[-1] / points[0]:.2f} of the first harvest's "
                  f"{points[0] / 2**20:.0f} MiB",
                  "after each: " + ", ".join(f"x{p / points[0]:.2f}" for p in points[1:]),
                  values={"bytes": points}))
