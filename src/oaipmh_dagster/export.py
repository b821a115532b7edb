"""Export a harvester's records to Parquet, CSV or JSON Lines (pandas)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oaipmh_dagster.store import Store

FORMATS = ("parquet", "csv", "jsonl")
BATCH = 10_000


def flatten(item: dict[str, Any], *, max_len: int | None = None) -> dict[str, Any]:
    """One record as flat columns: `metadata.<field>` with lists joined by ' | '."""
    out: dict[str, Any] = {
        "oai_identifier": item["oai_identifier"],
        "datestamp": item["datestamp"],
        "deleted": item["deleted"],
        "sets": " | ".join(item["sets"]),
        "errors": json.dumps(item["errors"]) if item["errors"] else "",
    }
    for key, value in (item.get("metadata") or {}).items():
        if isinstance(value, list):
            value = " | ".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                               for v in value)
        elif isinstance(value, dict):
            value = json.dumps(value, ensure_ascii=False)
        if max_len is not None and isinstance(value, str) and len(value) > max_len:
            value = value[: max_len - 1] + "…"
        out[f"metadata.{key}"] = value
    return out


def _batches(store: Store, harvester_id: str) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for item in store.iter_records(harvester_id):
        batch.append(item)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def export(store: Store, harvester_id: str, fmt: str, output: Path) -> int:
    """Write every record of a harvester to `output`; returns the number written.

    Written to a temporary file first, renamed on success: a failure leaves nothing."""
    import pandas as pd

    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    tmp = output.with_name(f".{output.name}.partial")
    n = 0
    try:
        if fmt == "jsonl":
            with tmp.open("w", encoding="utf-8") as fh:
                for item in store.iter_records(harvester_id):
                    fh.write(json.dumps(item, ensure_ascii=False) + "\n")
                    n += 1
        elif fmt == "csv":
            frames = [pd.DataFrame([flatten(i) for i in b]) for b in _batches(store, harvester_id)]
            frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
                columns=["oai_identifier", "datestamp", "deleted", "sets", "errors"])
            frame.to_csv(tmp, index=False)
            n = len(frame)
        else:
            rows = []
            for b in _batches(store, harvester_id):
                for item in b:
                    rows.append({**item, "metadata": json.dumps(item["metadata"], ensure_ascii=False)
                                 if item["metadata"] is not None else None,
                                 "errors": json.dumps(item["errors"])})
            frame = pd.DataFrame(rows, columns=["oai_identifier", "datestamp", "deleted", "sets",
                                                "metadata", "errors", "harvested_at", "run_id"])
            frame.to_parquet(tmp, index=False)
            n = len(frame)
        tmp.replace(output)
    finally:
        if tmp.exists():
            tmp.unlink()
    return n
