"""Case 18: what an asset downstream of `records` costs at 1,000,000 records: the whole
DataFrame (`records_frame`, what an input annotated `pd.DataFrame` receives) against
batches (`RecordBatches`, an input annotated `RecordBatches` or given a `batch_size`).

The store is a SQLite file on disk (not /dev/shm: about 1.5 GB at 1,000,000 records)
filled with `INSERT ... SELECT` from 1,000 distinct demo records (realistic `oai_dc`
transformed by the built-in transformer, raw XML included) cycled with fresh
identifiers and datestamps over five years; every 20th record is a tombstone. Each
reading runs in a fresh child (`benchmarks.child frames`) and counts the live records
per datestamp year, so both do the same work. Reported: the peak RSS growth over the
RSS after imports and engine set-up (the kernel's peak mark reset there), the wall
time, and the RSS the built whole frame holds (its `memory_usage(deep=True)` leaves out
the strings inside the lists of the metadata columns)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cases import Bench, Row, _fmt_bytes

H = "bench"
TEMPLATES = 1_000
# Where the SQLite file goes: a disk, not the RAM-backed TMPDIR the tests use.
DISK_TMP_ENV = "OAIPMH_BENCH_DISK_TMP"


def _templates() -> list[tuple[str, str, str]]:
    """(raw XML, metadata JSON, sets JSON) of the distinct records the store cycles."""
    from oaipmh_dagster.demo.dataset import make_dataset
    from oaipmh_dagster.transform import transform_record

    out = []
    for rec in make_dataset(TEMPLATES * 2, seed=7, deleted_ratio=0.0, prefixes=("oai_dc",)):
        xml = rec.metadata.get("oai_dc")
        if xml is None:
            continue
        out.append((xml, json.dumps(transform_record("oai_dc", xml)), json.dumps(list(rec.sets))))
        if len(out) == TEMPLATES:
            break
    return out


def fill(url: str, n: int) -> dict[str, Any]:
    """A migrated store at `url` holding `n` records of harvester `bench`."""
    import sqlalchemy as sa

    from oaipmh_dagster.storage import db

    engine = db.get_engine(url)
    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TEMP TABLE tpl (i INTEGER PRIMARY KEY, raw TEXT, "
                             "meta TEXT, sets TEXT)")
        conn.execute(sa.text("INSERT INTO tpl VALUES (:i, :raw, :meta, :sets)"),
                     [{"i": i, "raw": raw, "meta": meta, "sets": sets}
                      for i, (raw, meta, sets) in enumerate(_templates())])
        # Five years of datestamps (1 January 2019 onwards), one every 157 s.
        conn.exec_driver_sql(
            "WITH RECURSIVE c(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM c WHERE n < ?) "
            "INSERT INTO oaipmh_record (harvester_id, oai_identifier, datestamp, deleted, "
            "sets, raw_xml, metadata, errors, harvested_at, run_id, transformed_at, "
            "content_hash) "
            "SELECT ?, printf('oai:bench:%09d', c.n), "
            "strftime('%Y-%m-%dT%H:%M:%SZ', 1546300800 + c.n * 157, 'unixepoch'), "
            "c.n % 20 = 0, tpl.sets, CASE WHEN c.n % 20 = 0 THEN NULL ELSE tpl.raw END, "
            "CASE WHEN c.n % 20 = 0 THEN NULL ELSE tpl.meta END, '[]', "
            "CURRENT_TIMESTAMP, 'bench', CURRENT_TIMESTAMP, 'h' "
            "FROM c JOIN tpl ON tpl.i = c.n % ?",
            (n - 1, H, TEMPLATES))
    seconds = time.perf_counter() - t0
    engine.dispose()
    db.dispose_all()
    return {"records": n, "fill_seconds": seconds}


def frames_child(args: dict[str, Any]) -> dict[str, Any]:
    """One reading in a fresh process: `mode` "frame" or "batches" (`batch_size`)."""
    from benchmarks.child import _reset_peak_rss, _rss_kib, _vm_kib
    from oaipmh_dagster.operations.frames import RecordBatches, records_frame
    from oaipmh_dagster.storage import db, open_store

    store = open_store(db.get_engine(args["url"], migrate=False))
    store.count(H)  # the engine's first connection, before the baseline
    # pandas and what it loads on first use (its string and datetime code), as well
    next(iter(RecordBatches(store, H, batch_size=10)))
    gc.collect()
    out: dict[str, Any] = {"mode": args["mode"], "batch_size": args.get("batch_size")}
    out["peak_reset"] = _reset_peak_rss()
    out["rss_base_kib"] = _vm_kib("VmRSS") if out["peak_reset"] else _rss_kib()
    t0 = time.perf_counter()
    years: dict[int, int] = {}
    rows = 0
    if args["mode"] == "frame":
        frame = records_frame(store, H)
        gc.collect()
        out["rss_frame_kib"] = _vm_kib("VmRSS")  # what the frame holds, once built
        out["frame_bytes"] = int(frame.memory_usage(deep=True).sum())
        frames = [frame]
        del frame
    else:
        frames = RecordBatches(store, H, batch_size=int(args["batch_size"]))  # type: ignore[assignment]
    for part in frames:
        rows += len(part)
        for year, count in part["datestamp"].dt.year.value_counts().items():
            years[int(year)] = years.get(int(year), 0) + int(count)
    out["seconds"] = time.perf_counter() - t0
    out["rows"] = rows
    out["years"] = len(years)
    out["rss_peak_kib"] = _vm_kib("VmHWM") or _rss_kib()
    out["peak_bytes"] = max(0, out["rss_peak_kib"] - out["rss_base_kib"]) * 1024
    return out


def case_downstream(b: Bench) -> None:
    """Case 18: the whole frame vs batches, peak RSS and time."""
    n = b.sizes.frames_records
    where = Path(tempfile.mkdtemp(prefix="oaipmh-bench-frames-",
                                  dir=os.environ.get(DISK_TMP_ENV, "/var/tmp")))
    try:
        url = f"sqlite:///{where / 'frames.sqlite'}"
        filled = fill(url, n)
        size = (where / "frames.sqlite").stat().st_size
        b.echo(f"  store: {n:,} records ({n - (n + 19) // 20:,} live) in "
               f"{filled['fill_seconds']:.1f} s, {_fmt_bytes(size)}")
        out: dict[str, Any] = {"fill": {**filled, "bytes": size}}
        plan = [("frame", None), *(("batches", s) for s in b.sizes.frames_batches)]
        for mode, batch in plan:
            label = "frame" if batch is None else f"batches/{batch}"
            out[label] = b.child("frames", {"url": url, "mode": mode, "batch_size": batch},
                                 timeout=3600)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    b.raw["downstream"] = out
    whole = out["frame"]
    live = whole["rows"]
    held = max(0, whole["rss_frame_kib"] - whole["rss_base_kib"]) * 1024
    b.add(Row("18", f"downstream input, whole DataFrame, {live:,} live records (SQLite)",
              f"peak RSS +{_fmt_bytes(whole['peak_bytes'])}",
              f"{whole['seconds']:.1f} s; the built frame holds {_fmt_bytes(held)} of RSS "
              f"({held / max(live, 1):,.0f} B per record; pandas' memory_usage(deep=True) "
              f"counts {_fmt_bytes(whole['frame_bytes'])}: not the strings inside lists)",
              values=whole))
    for batch in b.sizes.frames_batches:
        r = out[f"batches/{batch}"]
        ratio = whole["peak_bytes"] / r["peak_bytes"] if r["peak_bytes"] else float("inf")
        ok = r["rows"] == live and r["peak_bytes"] * 5 <= whole["peak_bytes"]
        b.add(Row("18", f"downstream input, RecordBatches of {batch:,} rows, {live:,} live "
                  "records (SQLite)",
                  f"peak RSS +{_fmt_bytes(r['peak_bytes'])}",
                  f"{r['seconds']:.1f} s; x{ratio:.0f} less than the whole frame; "
                  f"{r['rows']:,} rows", target="<= 1/5 of the whole frame",
                  ok="ok" if ok else "MISS", values=r))
