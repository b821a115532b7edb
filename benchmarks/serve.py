"""Case 17: the hub as an OAI-PMH data provider (`oaipmh-dagster serve`), harvested by
Sickle from a PostgreSQL store of 1,000,000 records (four oai_dc harvesters, one record
in fifty deleted, filled by INSERT ... SELECT generate_series, then VACUUM ANALYZE).

The server runs as `oaipmh-dagster serve` in a process of its own (one uvicorn worker,
500 records a page, no access log); Sickle harvests in this process, so the two share
the machine's cores. Measured: ListRecords from the start of the list (the first N
records), the same deep in the list (from a datestamp near its end), one harvester's
set, ListIdentifiers; the server's resident memory before and after (a request's memory
is bounded by its page); and, as the peer, Sickle parsing the very pages it was served
from memory, which is the ceiling of what a Sickle harvest can reach here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import httpx

from benchmarks.cases import ROOT, Bench, Row, _end_group, _free_port, postgres_database

TARGET = 2_000  # records per second, served to Sickle
STORE = 1_000_000
HARVESTERS = 4
PAGE = 500

_TITLE = ("'Measurements of a quantity number ' || g || ' in a series of experiments "
          "on the hub''s store'")
_RAW = (
    "'<oai_dc:dc xmlns:oai_dc=\"http://www.openarchives.org/OAI/2.0/oai_dc/\" "
    "xmlns:dc=\"http://purl.org/dc/elements/1.1/\" "
    "xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" "
    "xsi:schemaLocation=\"http://www.openarchives.org/OAI/2.0/oai_dc/ "
    "http://www.openarchives.org/OAI/2.0/oai_dc.xsd\">"
    "<dc:title>' || " + _TITLE + " || '</dc:title>"
    "<dc:creator>Author, First ' || (g % 997) || '</dc:creator>"
    "<dc:creator>Author, Second ' || (g % 991) || '</dc:creator>"
    "<dc:subject>physics</dc:subject><dc:subject>measurement</dc:subject>"
    "<dc:description>An abstract of record ' || g || ' that says what was measured, "
    "how, and what came out of it, in a sentence or two of ordinary length.</dc:description>"
    "<dc:date>20' || lpad((g % 25)::text, 2, '0') || '-01-01</dc:date>"
    "<dc:type>Article</dc:type>"
    "<dc:identifier>https://repository.example.org/record/' || g || '</dc:identifier>"
    "<dc:identifier>https://doi.org/10.1234/example.' || g || '</dc:identifier>"
    "<dc:language>en</dc:language><dc:rights>CC BY 4.0</dc:rights></oai_dc:dc>'"
)
FILL = f"""
INSERT INTO oaipmh_record (harvester_id, oai_identifier, datestamp, deleted, sets, raw_xml,
                           metadata, errors, harvested_at, run_id, transformed_at,
                           content_hash)
SELECT 'h' || (g % {HARVESTERS}), 'oai:repo.example.org:' || g, '2024-01-01T00:00:00Z',
       g % 50 = 0, '["physics"]'::jsonb,
       CASE WHEN g % 50 = 0 THEN NULL ELSE {_RAW} END,
       NULL, '[]'::jsonb,
       timestamptz '2025-01-01 00:00:00+00' + (g / 40) * interval '1 second'
           + (g % 40) * interval '1 millisecond',
       NULL, NULL, md5(g::text)
FROM generate_series(1, :n) AS g
"""  # noqa: S608 - constants of this module, no input


def _fill(url: str, n: int) -> dict[str, Any]:
    import sqlalchemy as sa

    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import Harvester, Registry

    engine = db.get_engine(url)
    registry = Registry(engine)
    for i in range(HARVESTERS):
        registry.add(Harvester(id=f"h{i}", base_url=f"http://source{i}.example.org/oai",
                               metadata_prefix="oai_dc", sets=("physics",)))
    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(sa.text(FILL), {"n": n})
    filled = time.perf_counter() - t0
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE oaipmh_record"))
        size = conn.execute(sa.text(
            "SELECT pg_total_relation_size('oaipmh_record')")).scalar_one()
    engine.dispose()
    db.dispose_all()
    return {"fill_seconds": filled, "vacuum_seconds": time.perf_counter() - t0 - filled,
            "table_bytes": int(size)}


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _harvest(url: str, limit: int, **params: str) -> dict[str, Any]:
    """Sickle over one list, stopped after `limit` records: rate, pages, bodies' bytes."""
    from sickle import Sickle

    bodies: list[bytes] = []
    sickle = Sickle(url, max_retries=0, timeout=120)
    verb = params.pop("verb", "ListRecords")
    t0 = time.perf_counter()
    items = sickle.ListRecords(**params) if verb == "ListRecords" else \
        sickle.ListIdentifiers(**params)
    n = 0
    first_page = None
    for _ in items:
        if first_page is None:
            first_page = time.perf_counter() - t0
        n += 1
        if len(bodies) < 40 and items.oai_response.raw not in bodies:
            bodies.append(items.oai_response.raw)
        if n >= limit:
            break
    seconds = time.perf_counter() - t0
    return {"records": n, "seconds": seconds, "rate": n / seconds,
            "first_page_seconds": first_page, "sample_pages": bodies}


def _parse_only(bodies: list[Any]) -> float:
    """Sickle's records per second on pages already in memory (no server, no HTTP)."""
    from lxml import etree
    from sickle.models import Record

    n = 0
    t0 = time.perf_counter()
    for _ in range(3):
        for raw in bodies:
            tree = etree.XML(raw.encode("utf-8") if isinstance(raw, str) else raw)
            for el in tree.iterfind(".//{http://www.openarchives.org/OAI/2.0/}record"):
                Record(el)
                n += 1
    return n / (time.perf_counter() - t0)


def _serve(url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "OAIPMH_DATABASE_URL": url, "OAIPMH_SERVE_PAGE_SIZE": str(PAGE),
           "OAIPMH_SERVE_ADMIN_EMAIL": "bench@example.org", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "oaipmh_dagster.cli", "serve", "--port",
                             str(port), "--no-access-log"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"serve ended: {err[-500:]}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/oai?verb=Identify", timeout=5)
            return proc
        except httpx.TransportError:
            time.sleep(0.3)
    _end_group(proc)
    raise RuntimeError("serve did not answer within 120 s")


def case_serve(b: Bench) -> None:
    """Case 17: records per second served to Sickle from a 1,000,000-record store."""
    n = b.sizes.serve_store
    per_list = b.sizes.serve_records
    try:
        with postgres_database(os.environ.get("OAIPMH_BENCH_SERVE_DB")) as url:
            fill = _fill(url, n)
            b.echo(f"  filled {n:,} records in {fill['fill_seconds']:.1f} s "
                   f"(+ VACUUM ANALYZE {fill['vacuum_seconds']:.1f} s), "
                   f"{fill['table_bytes'] / 2**20:.0f} MiB")
            port = _free_port()
            proc = _serve(url, port)
            try:
                base = f"http://127.0.0.1:{port}/oai"
                rss0 = _rss_kib(proc.pid)
                # Deep in the list: the last tenth of the change times.
                deep_from = time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime(1735689600 + (n * 9 // 10) // 40))
                runs = {
                    "start": _harvest(base, per_list, metadataPrefix="oai_dc"),
                    "deep": _harvest(base, per_list, metadataPrefix="oai_dc",
                                     **{"from": deep_from}),
                    "set": _harvest(base, per_list, metadataPrefix="oai_dc", set="h2"),
                    "identifiers": _harvest(base, per_list, verb="ListIdentifiers",
                                            metadataPrefix="oai_dc"),
                }
                rss1 = _rss_kib(proc.pid)
            finally:
                _end_group(proc)
    except Exception as exc:  # noqa: BLE001 - PostgreSQL unreachable: report, go on
        b.add(Row("17", "OAI-PMH data provider served to Sickle", "n/a", f"error: {exc}"))
        return
    ceiling = _parse_only(runs["start"]["sample_pages"])
    for r in runs.values():
        r.pop("sample_pages")
    b.raw["serve"] = {"fill": fill, "runs": runs, "rss_kib": [rss0, rss1],
                      "sickle_parse_only": ceiling}
    start, deep, one_set = runs["start"], runs["deep"], runs["set"]
    worst = min(start["rate"], deep["rate"], one_set["rate"])
    b.add(Row("17", f"ListRecords served to Sickle from a {n:,}-record PostgreSQL store "
              f"({per_list:,} records a list, {PAGE} a page)",
              f"{start['rate']:,.0f} rec/s from the start, {deep['rate']:,.0f} deep, "
              f"{one_set['rate']:,.0f} in one set",
              f"Sickle parsing the same pages from memory: {ceiling:,.0f} rec/s "
              f"(x{start['rate'] / ceiling:.2f}); ListIdentifiers "
              f"{runs['identifiers']['rate']:,.0f}/s; server RSS {rss0 / 1024:.0f} -> "
              f"{rss1 / 1024:.0f} MiB",
              f">= {TARGET:,} rec/s", "ok" if worst >= TARGET else "MISS",
              values=b.raw["serve"]))
