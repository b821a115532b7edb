"""Case 14: bytes per record on PostgreSQL before and after migration 0009 (raw XML and
metadata in lz4 with a 256-byte TOAST tuple target, instead of pglz applied only to rows
over 2 KiB). The records are the real ones of ../shared/oai-realworld's ListRecords pages
(DSpace, Alma, arXiv, Invenio, EPrints ... in oai_dc, MARC, MODS, DataCite and more),
cycled with fresh identifiers up to N, written in pages of 500 into two fresh databases,
one at revision 0008 and one at the head. Reported: the record table's whole size
(heap, TOAST, indexes) per record, its heap alone (what a scan of identifiers, datestamps
and flags reads), the mean stored size of `raw_xml` against its text length, and the
write time of each."""

from __future__ import annotations

import csv
import json
import time
from typing import Any

from benchmarks.cases import ROOT, Bench, Row, postgres_database

REALWORLD = ROOT.parent / "shared" / "oai-realworld"
PAGE = 500


def realworld_records() -> list[tuple[str, dict[str, Any]]]:
    """(raw XML, a flat metadata dict) of every record with metadata in the shared
    ListRecords pages."""
    from lxml import etree

    out = []
    with (REALWORLD / "MANIFEST.tsv").open(encoding="utf-8") as f:
        files = [r["file"] for r in csv.DictReader(f, delimiter="\t")
                 if r["verb"] == "ListRecords" and r["http_status"] == "200"]
    parser = etree.XMLParser(recover=True, resolve_entities=False, no_network=True)
    for name in files:
        try:
            root = etree.parse(str(REALWORLD / "files" / name), parser).getroot()
        except (OSError, etree.XMLSyntaxError):
            continue
        if root is None:
            continue
        for rec in root.iter("{*}record"):
            meta = next(rec.iter("{*}metadata"), None)
            if meta is None:
                continue
            fields: dict[str, list[str]] = {}
            for el in meta.iter():
                if isinstance(el.tag, str) and el.text and el.text.strip():
                    fields.setdefault(etree.QName(el).localname, []).append(el.text.strip())
            out.append((etree.tostring(rec, encoding="unicode"), fields))
    return out


def _fill(url: str, revision: str, records: list[tuple[str, dict[str, Any]]],
          n: int) -> dict[str, Any]:
    import sqlalchemy as sa

    from oaipmh_dagster.storage import db

    engine = db.get_engine(url, migrate=False)
    db.upgrade(engine, revision)
    insert = sa.text(
        "INSERT INTO oaipmh_record (harvester_id, oai_identifier, datestamp, deleted, sets, "
        "raw_xml, metadata, errors, harvested_at) VALUES ('bench', :id, '2024-01-01', "
        "false, '[]', :raw, :meta, '[]', CURRENT_TIMESTAMP)")
    metas = [json.dumps(m) for _, m in records]
    t0 = time.perf_counter()
    for start in range(0, n, PAGE):
        rows = [{"id": f"oai:bench:{i}", "raw": records[i % len(records)][0],
                 "meta": metas[i % len(records)]} for i in range(start, min(n, start + PAGE))]
        with engine.begin() as conn:
            conn.execute(insert, rows)
    seconds = time.perf_counter() - t0
    with engine.connect() as conn:
        total, heap = conn.execute(sa.text(
            "SELECT pg_total_relation_size('oaipmh_record'), "
            "pg_relation_size('oaipmh_record')")).one()
        stored, text = conn.execute(sa.text(
            "SELECT avg(pg_column_size(raw_xml)), avg(octet_length(raw_xml)) "
            "FROM oaipmh_record")).one()
    engine.dispose()
    db.dispose_all()
    return {"revision": revision, "seconds": seconds, "bytes_per_record": total / n,
            "heap_per_record": heap / n,
            "raw_stored": float(stored), "raw_text": float(text)}


def case_compression(b: Bench) -> None:
    """Case 14: the record table's bytes per record, 0008 vs 0009 (PostgreSQL)."""
    n = b.sizes.compression_records
    records = realworld_records()
    if not records:
        b.add(Row("14", "record bytes on PostgreSQL", "n/a", f"no records in {REALWORLD}"))
        return
    out: dict[str, Any] = {}
    try:
        for revision in ("0008", "head"):
            with postgres_database() as url:
                out[revision] = _fill(url, revision, records, n)
    except Exception as exc:  # noqa: BLE001 - PostgreSQL unreachable: report, go on
        b.add(Row("14", "record bytes on PostgreSQL", "n/a", f"error: {exc}"))
        return
    before, after = out["0008"], out["head"]
    b.raw["compression"] = out
    b.add(Row("14", f"record table bytes per record, {n:,} real-world records "
              f"({len(records)} distinct), PostgreSQL",
              f"{after['bytes_per_record']:.0f} B with lz4 (0009)",
              f"{before['bytes_per_record']:.0f} B with the defaults (0008): "
              f"x{after['bytes_per_record'] / before['bytes_per_record']:.2f}; heap (what a "
              f"scan of identifiers and datestamps reads) {after['heap_per_record']:.0f} B vs "
              f"{before['heap_per_record']:.0f} B; raw_xml "
              f"stored {after['raw_stored']:.0f} B vs {before['raw_stored']:.0f} B of "
              f"{after['raw_text']:.0f} B text; write {after['seconds']:.1f} s vs "
              f"{before['seconds']:.1f} s", values=out))
