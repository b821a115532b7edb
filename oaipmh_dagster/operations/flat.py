"""A stored record as flat columns: the rows of exports and of the asset preview."""

from __future__ import annotations

import json
from typing import Any

from oaipmh_dagster.transform.xml import readable

__all__ = ["display_title", "flatten"]


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


def display_title(metadata: Any) -> str:
    """A record's title for a table: the `title` (or first of `titles`) of a format's
    fields, else the first value of an element named title (the generic mapping's
    `.../title`); "" when none."""
    meta = readable(metadata)
    if not isinstance(meta, dict):
        return ""
    title = meta.get("title") or meta.get("titles")
    if not title:
        title = next((v for k, v in meta.items()
                      if isinstance(k, str) and k.rpartition("/")[2] == "title" and v), "")
    if isinstance(title, list):
        title = title[0] if title else ""
    if isinstance(title, dict):
        title = title.get("title") or ""
    return str(title)
