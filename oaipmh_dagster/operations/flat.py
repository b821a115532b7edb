"""A stored record as flat columns: the rows of exports and of the asset preview."""

from __future__ import annotations

import json
from typing import Any

from oaipmh_dagster.transform.xml import readable

__all__ = ["flatten"]


def flatten(item: dict[str, Any], *, max_len: int | None = None) -> dict[str, Any]:
    """One record as flat columns: `metadata.<field>` with lists joined by ' | ' (a row
    of the generic mapping's old lossless shape as its element paths)."""
    out: dict[str, Any] = {
        "oai_identifier": item["oai_identifier"],
        "datestamp": item["datestamp"],
        "deleted": item["deleted"],
        "sets": " | ".join(item["sets"]),
        "errors": json.dumps(item["errors"]) if item["errors"] else "",
    }
    for key, value in (readable(item.get("metadata")) or {}).items():
        if isinstance(value, list):
            value = " | ".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                               for v in value)
        elif isinstance(value, dict):
            value = json.dumps(value, ensure_ascii=False)
        if max_len is not None and isinstance(value, str) and len(value) > max_len:
            value = value[: max_len - 1] + "…"
        out[f"metadata.{key}"] = value
    return out
