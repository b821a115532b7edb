"""What ListMetadataFormats says of a prefix: the namespace and schema of the records
harvested in it, read from a stored record (its root's namespace and the
xsi:schemaLocation it names), else the well-known formats' published values."""

from __future__ import annotations

from typing import NamedTuple

from lxml import etree

XSI = "{http://www.w3.org/2001/XMLSchema-instance}schemaLocation"


class FormatInfo(NamedTuple):
    prefix: str
    schema: str
    namespace: str


# The published schema and namespace of formats a hub commonly holds.
KNOWN: dict[str, tuple[str, str]] = {
    "oai_dc": ("http://www.openarchives.org/OAI/2.0/oai_dc.xsd",
               "http://www.openarchives.org/OAI/2.0/oai_dc/"),
    "marc21": ("http://www.loc.gov/standards/marcxml/schema/MARC21slim.xsd",
               "http://www.loc.gov/MARC21/slim"),
    "marcxml": ("http://www.loc.gov/standards/marcxml/schema/MARC21slim.xsd",
                "http://www.loc.gov/MARC21/slim"),
    "oai_datacite": ("http://schema.datacite.org/oai/oai-1.1/oai.xsd",
                     "http://schema.datacite.org/oai/oai-1.1/"),
    "datacite": ("http://schema.datacite.org/meta/kernel-4/metadata.xsd",
                 "http://datacite.org/schema/kernel-4"),
    "mods": ("http://www.loc.gov/standards/mods/v3/mods-3-7.xsd", "http://www.loc.gov/mods/v3"),
}

_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)


def from_xml(prefix: str, raw_xml: str) -> FormatInfo | None:
    """The format of one stored record (None when its root has no namespace)."""
    try:
        root = etree.fromstring(raw_xml.encode("utf-8"), _PARSER)
    except (etree.XMLSyntaxError, ValueError):
        return None
    namespace = etree.QName(root).namespace
    if not namespace:
        return None
    pairs = (root.get(XSI) or "").split()
    schema = dict(zip(pairs[::2], pairs[1::2], strict=False)).get(namespace)
    known = KNOWN.get(prefix.lower())
    if schema is None:
        schema = known[0] if known and known[1] == namespace else namespace
    return FormatInfo(prefix, schema, namespace)


def describe(prefix: str, sample: str | None) -> FormatInfo | None:
    """The format of `prefix`, from a stored record when there is one."""
    found = from_xml(prefix, sample) if sample else None
    if found is not None:
        return found
    known = KNOWN.get(prefix.lower())
    return FormatInfo(prefix, *known) if known else None
