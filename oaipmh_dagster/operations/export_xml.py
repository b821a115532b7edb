"""Export as one XML document: a harvester's records as harvested, streamed record by
record (constant memory), like `metha-cat` does for its caches.

    <?xml version="1.0" encoding="UTF-8"?>
    <records xmlns="http://www.openarchives.org/OAI/2.0/" harvester="ID">
      <record>
        <header [status="deleted"]><identifier/><datestamp/><setSpec/>...</header>
        <metadata>the metadata element's child, byte for byte as stored</metadata>
        <about>...</about>  (each provenance/rights block, when stored)
      </record>
      ...
    </records>

Each `record` is an OAI-PMH `record` element (namespace and content as in ListRecords),
so a reader of OAI-PMH responses reads them. A record whose metadata could not be read
(stored without XML) has a header only. The number of records is written last, in a
comment after the root element, because the document is streamed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, BinaryIO
from xml.sax.saxutils import escape, quoteattr

OAI_NS = "http://www.openarchives.org/OAI/2.0/"

__all__ = ["OAI_NS", "write_xml"]


def _record(item: dict[str, Any]) -> str:
    status = ' status="deleted"' if item["deleted"] else ""
    parts = [f"<record><header{status}><identifier>{escape(item['oai_identifier'])}"
             f"</identifier><datestamp>{escape(item['datestamp'])}</datestamp>"]
    parts += [f"<setSpec>{escape(s)}</setSpec>" for s in item["sets"]]
    parts.append("</header>")
    raw = item.get("raw_xml")
    if raw and not item["deleted"]:
        parts.append(f"<metadata>{raw}</metadata>")
    parts += [f"<about>{block}</about>" for block in item.get("about") or ()]
    parts.append("</record>\n")
    return "".join(parts)


def write_xml(items: Iterable[dict[str, Any]], fh: BinaryIO, harvester_id: str) -> int:
    """Write `items` (the store's records with `raw_xml`) as one document; the count."""
    fh.write(b'<?xml version="1.0" encoding="UTF-8"?>\n'
             + f"<records xmlns={quoteattr(OAI_NS)} harvester={quoteattr(harvester_id)}>\n"
             .encode())
    n = 0
    for item in items:
        fh.write(_record(item).encode("utf-8"))
        n += 1
    fh.write(f"</records>\n<!-- {n} records -->\n".encode())
    return n
