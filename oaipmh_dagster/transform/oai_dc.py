"""``oai_dc``: simple Dublin Core to a dict of string lists.

Every one of the 15 DC elements is a key (in the order the standard lists them), so
the schema is the same for every record; an element the record lacks is ``[]``.
Values keep document order, are stripped, and blank values are dropped.
"""

from __future__ import annotations

from typing import Any

from lxml import etree

from ._util import TransformError, element_path, text_of

DC_NS = "http://purl.org/dc/elements/1.1/"
OAI_DC_NS = "http://www.openarchives.org/OAI/2.0/oai_dc/"

DC_ELEMENTS: tuple[str, ...] = (
    "title",
    "creator",
    "subject",
    "description",
    "publisher",
    "contributor",
    "date",
    "type",
    "format",
    "identifier",
    "source",
    "language",
    "relation",
    "coverage",
    "rights",
)
_DC_ANY = f"{{{DC_NS}}}*"
_PREFIX_LEN = len(DC_NS) + 2


def transform(root: etree._Element) -> dict[str, Any]:
    """Map an ``oai_dc:dc`` element (or any element holding ``dc:*`` children)."""
    out: dict[str, list[str]] = {name: [] for name in DC_ELEMENTS}
    found = False
    for child in root.iterchildren(_DC_ANY):
        values = out.get(child.tag[_PREFIX_LEN:])
        if values is not None:
            found = True
            value = text_of(child)
            if value is not None:
                values.append(value)
    if not found and not root.tag.endswith("}dc") and root.tag != "dc":
        raise TransformError(
            "unexpected_format",
            f"expected an oai_dc:dc element with Dublin Core children, got {root.tag!r}",
            element_path(root),
        )
    return out
