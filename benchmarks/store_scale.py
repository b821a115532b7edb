"""Case 15: what one harvester's work costs as the PostgreSQL store grows (migration 0010:
records partitioned by harvester). For each store size S (records of other harvesters,
100,000 per harvester, generated in the database with generate_series into their
partitions), in a fresh database: a first harvest of N records from the benchmark
server into a new harvester, the same harvest again (unchanged: nothing is written),
`records ID --limit 100` (the CLI's read), an `export` to JSON lines, a `profile`, and
the state lookup a harvest starts with (lease + checkpoint + counts). Reported: each
cost at S as a ratio to the same in the empty store (S = 0), the curve kept in the JSON;
`--store-layouts 0009,head` also measures the one-table layout of 0009 for contrast.

    python -m benchmarks.run --cases 15 --store-sizes 0,1000000,3000000
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

from benchmarks.cases import Bench, Row, postgres_database
from benchmarks.pages import ServerProcess

PER_HARVESTER = 100_000  # records of each other harvester
TARGET = 1.25  # at most this times the empty store's cost


def generated(harvester_id: str, n: int, *, version: int = 0, start: int = 0) -> str:
    """A subquery of `n` generated rows of `harvester_id` (numbered from `start` + 1) with
    every column of the record table (about 700 bytes of raw XML and a small metadata
    document each); `version` changes the content, the datestamp and the hash."""
    return (
        f"(SELECT CAST('{harvester_id}' AS varchar) AS harvester_id, "  # noqa: S608 - generated ids, numbers
        f"'oai:{harvester_id}:' || lpad(CAST(i AS text), 9, '0') AS oai_identifier, "
        "to_char(timestamp '2020-01-01' + (i + " f"{version * 1000}) * interval '1 second', "
        "'YYYY-MM-DD\"T\"HH24\\:MI\\:SS\"Z\"') AS datestamp, "
        "mod(i, 20) = 0 AS deleted, CAST('[\"set_a\"]' AS jsonb) AS sets, "
        "'<record><header><identifier>oai:x:' || i || '</identifier></header><metadata>"
        "<dc><title>' || repeat(md5(CAST(i + " f"{version} AS text)) || ' ', 18) || "
        "'</title></dc></metadata></record>' AS raw_xml, "
        "jsonb_build_object('title', md5(CAST(i AS text)), 'creator', "
        "jsonb_build_array(md5(CAST(i + 1 AS text)))) AS metadata, "
        "CAST('[]' AS jsonb) AS errors, now() AS harvested_at, CAST('fill' AS varchar) "
        "AS run_id, now() AS transformed_at, "
        f"md5(CAST(i + {version} AS text)) AS content_hash, CAST(NULL AS jsonb) AS about "
        f"FROM generate_series({start + 1}, {start + n}) AS i) AS g"
    )


def fill(engine: Any, harvester_id: str, n: int, *, version: int = 0) -> None:
    """`n` generated records of `harvester_id`, bulk-loaded: into a new partition built
    after the load (0010), else appended to the one table (0009)."""
    import sqlalchemy as sa

    from oaipmh_dagster.storage import partitions

    source = generated(harvester_id, n, version=version)
    with engine.begin() as conn:
        if partitions.is_partitioned(conn):
            partitions.lock(conn, harvester_id)
            partitions.create_in(conn, harvester_id, copy_from=source)
        else:
            cols = ", ".join(partitions.columns(conn))
            conn.execute(sa.text(f"INSERT INTO oaipmh_record ({cols}) "  # noqa: S608
                                 f"SELECT {cols} FROM {source}"))


def fill_others(engine: Any, total: int) -> float:
    """`total` records of other harvesters (`other_<k>`, `PER_HARVESTER` each); seconds."""
    import sqlalchemy as sa

    t0 = time.perf_counter()
    for k in range(0, total, PER_HARVESTER):
        fill(engine, f"other_{k // PER_HARVESTER:05d}", min(PER_HARVESTER, total - k))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE"))
        conn.execute(sa.text("CHECKPOINT"))  # the fill's pages written out, not later
    return time.perf_counter() - t0


# The store's queries of one harvester, as it sends them (psycopg2 binds values on the
# client, so the server plans them with the harvester id as a constant).
QUERIES = {
    "hashes (500 ids)": (
        "SELECT v.id, r.content_hash FROM unnest(ARRAY(SELECT 'oai:{h}:' || "
        "lpad(CAST(i AS text), 9, '0') FROM generate_series(40001, 40500) AS i)) AS v(id) "
        "CROSS JOIN LATERAL (SELECT content_hash FROM oaipmh_record WHERE harvester_id = "
        "'{h}' AND oai_identifier = v.id LIMIT 1) AS r"),
    "records batch (1,000)": (
        "SELECT oai_identifier, datestamp, deleted, sets, metadata, errors FROM "
        "oaipmh_record WHERE harvester_id = '{h}' AND oai_identifier > 'oai:{h}:000050000' "
        "ORDER BY oai_identifier LIMIT 1000"),
    "count live": ("SELECT count(*) FROM oaipmh_record WHERE harvester_id = '{h}' AND NOT "
                   "deleted"),
    "since window": ("SELECT count(*) FROM oaipmh_record WHERE harvester_id = '{h}' AND "
                     "datestamp >= '2020-01-02T00:00:00Z'"),
}


def query_buffers(engine: Any, harvester_id: str) -> dict[str, dict[str, float]]:
    """Shared buffers each store query touches (hit + read: what it costs, whatever
    the machine's load) and its planning time in ms, from EXPLAIN (ANALYZE, BUFFERS)."""
    import sqlalchemy as sa

    out = {}
    with engine.connect() as conn:
        for name, sql in QUERIES.items():
            conn.exec_driver_sql(sql.format(h=harvester_id)).all()  # warm
            plan = conn.execute(sa.text(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.format(h=harvester_id)
            )).scalar_one()[0]
            top = plan["Plan"]
            out[name] = {"buffers": top["Shared Hit Blocks"] + top["Shared Read Blocks"],
                         "planning_ms": plan["Planning Time"]}
    return out


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(urls: dict[str, str], layout: str, size: int, server_url: str, records: int,
            tmp: Path, repeats: int) -> dict[str, dict[str, Any]]:
    """Every measurement in an empty store (`urls["base"]`) and one holding `size` other
    records (`urls["sized"]`), interleaved (the same load falls on both): `repeats` first
    harvests of new harvesters and re-harvests of them, then the reads of the first,
    each the best of its tries."""
    import sqlalchemy as sa

    from oaipmh_dagster.harvesting.harvest import harvest
    from oaipmh_dagster.operations.export import export
    from oaipmh_dagster.operations.profile import profile_store
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import Harvester
    from oaipmh_dagster.storage.store import Store

    stores: dict[str, Store] = {}
    out: dict[str, dict[str, Any]] = {}
    for key, url in urls.items():
        engine = db.get_engine(url, migrate=False)
        db.upgrade(engine, layout)
        out[key] = {"layout": layout, "size": size if key == "sized" else 0,
                    "fill_seconds": fill_others(engine, size if key == "sized" else 0)}
        stores[key] = Store(engine)

    def run(key: str, harvester_id: str) -> float:
        h = Harvester(id=harvester_id, base_url=server_url, metadata_prefix="oai_dc")
        t0 = time.perf_counter()
        stats = harvest(h, stores[key], run_id=uuid.uuid4().hex)
        seconds = time.perf_counter() - t0
        assert stats.counts.records == records, stats.counts
        return seconds

    def partition_bytes(key: str) -> int:
        """The first harvester's partition (0010), or the whole table (0009)."""
        with stores[key].engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT pg_total_relation_size(coalesce(to_regclass('oaipmh_record_bench_0'), "
                "to_regclass('oaipmh_record')))")).scalar() or 0)

    times: dict[str, dict[str, list[float]]] = {k: {} for k in urls}

    def note(key: str, op: str, seconds: float) -> None:
        times[key].setdefault(op, []).append(seconds)

    def order(rep: int) -> list[str]:
        """Which store goes first alternates: the second of a pair runs warmer."""
        keys = list(urls)
        return keys if rep % 2 == 0 else keys[::-1]

    for rep in range(repeats):
        for key in order(rep):
            note(key, "first_harvest", run(key, f"bench_{rep}"))
        for key in urls:
            out[key].setdefault("bytes_after_first", partition_bytes(key))
    for rep in range(repeats):
        for key in order(rep):
            note(key, "reharvest", run(key, f"bench_{rep}"))
        for key in urls:
            out[key].setdefault("bytes_after_reharvest", partition_bytes(key))
    path = tmp / f"export-{uuid.uuid4().hex[:6]}.jsonl"

    def reads(key: str) -> None:
        store = stores[key]
        for _ in range(5):
            note(key, "records_limit",
                 _timed(lambda: list(islice(store.iter_records("bench_0"), 100))))
            note(key, "state", _timed(lambda: (store.state("bench_0"), store.counts("bench_0"),
                                               store.has_records("bench_0"))))
        note(key, "export", _timed(lambda: export(store, "bench_0", "jsonl", path)))
        note(key, "profile", _timed(lambda: profile_store(store, "bench_0")))

    for rep in range(max(repeats, 4)):
        for key in order(rep):
            reads(key)
    path.unlink(missing_ok=True)
    for key in urls:
        out[key]["buffers"] = query_buffers(stores[key].engine, "bench_0")
    for key in urls:
        out[key].update({op: min(ts) for op, ts in times[key].items()})
        out[key]["tries"] = times[key]
        stores[key].engine.dispose()
    db.dispose_all()
    return out


OPS = (("first_harvest", "first harvest"), ("reharvest", "unchanged re-harvest"),
       ("records_limit", "records --limit 100"), ("export", "export jsonl"),
       ("profile", "profile"), ("state", "state lookup"))


def buffers_main(sizes: list[int], layouts: list[str], n: int = PER_HARVESTER) -> None:
    """`python -m benchmarks.store_scale SIZE[,SIZE] [LAYOUT,...]`: only the buffers each
    store query touches, `n` generated records of `bench_0` in stores of SIZE others."""
    import json

    from oaipmh_dagster.storage import db

    for layout in layouts:
        for size in sizes:
            with postgres_database() as url:
                engine = db.get_engine(url, migrate=False)
                db.upgrade(engine, layout)
                fill(engine, "bench_0", n)
                fill_others(engine, size)
                print(json.dumps({"layout": layout, "size": size,
                                  "buffers": query_buffers(engine, "bench_0")}), flush=True)
                engine.dispose()
                db.dispose_all()


def case_store_scale(b: Bench) -> None:
    """Case 15: a harvester's costs against the size of the rest of the store."""
    n = b.sizes.scale_records
    sizes = b.sizes.store_sizes
    curve: dict[str, list[dict[str, dict[str, Any]]]] = {}
    with ServerProcess(n, page_size=b.sizes.page_size) as srv:
        for layout in b.sizes.store_layouts:
            for size in sizes:
                with postgres_database() as base, postgres_database() as sized:
                    r = measure({"base": base, "sized": sized}, layout, size, srv.url, n,
                                b.tmp, b.sizes.scale_repeats)
                b.echo(f"    {layout} at {size:,} (fill {r['sized']['fill_seconds']:.0f} s): "
                       + ", ".join(f"{k} {r['sized'][k]:.3f} vs {r['base'][k]:.3f}"
                                   for k, _ in OPS))
                curve.setdefault(layout, []).append(r)
                b.raw["store_scale"] = {"records": n, "curve": curve}
    for layout, pairs in curve.items():
        for pair in pairs:
            base, point = pair["base"], pair["sized"]
            ratios = {k: point[k] / base[k] for k, _ in OPS}
            worst = max(ratios.values())
            b.add(Row(
                "15", f"{n:,}-record harvester in a store of {point['size']:,} other "
                f"records vs an empty one, PostgreSQL ({layout})",
                ", ".join(f"{label} x{ratios[k]:.2f}" for k, label in OPS),
                f"empty store: first harvest {base['first_harvest']:.1f} s, re-harvest "
                f"{base['reharvest']:.1f} s, export {base['export']:.1f} s, profile "
                f"{base['profile']:.2f} s, records --limit {base['records_limit'] * 1000:.1f} "
                f"ms, state {base['state'] * 1000:.1f} ms",
                f"<= x{TARGET}", "ok" if worst <= TARGET else "MISS",
                values={"ratios": ratios, "point": point, "base": base}))
            if "buffers" in point:
                b.add(Row("15", f"buffers per store query, store of {point['size']:,} vs "
                          f"empty ({layout})", ", ".join(
                              f"{q} {point['buffers'][q]['buffers']} vs "
                              f"{base['buffers'][q]['buffers']}" for q in QUERIES),
                          "planning " + ", ".join(
                              f"{point['buffers'][q]['planning_ms']:.2f} vs "
                              f"{base['buffers'][q]['planning_ms']:.2f} ms" for q in QUERIES),
                          values={"sized": point["buffers"], "base": base["buffers"]}))
            b.raw["store_scale"]["ratios"] = {
                f"{layout}@{p['sized']['size']}": {k: p["sized"][k] / p["base"][k]
                                                   for k, _ in OPS} for p in pairs}


if __name__ == "__main__":
    import sys

    buffers_main([int(x) for x in sys.argv[1].split(",")],
                 sys.argv[2].split(",") if len(sys.argv) > 2 else ["head"])
