"""``qdc``: qualified Dublin Core (``dc:`` and ``dcterms:`` elements) to a dict of lists.

Read from any root that holds them (``oai_qdc:qualifieddc`` of CONTENTdm, DSpace's
``qdc:qualifieddc``, ...). The keys are fixed, so the schema is the same for every
record (an absent element is ``[]``):

- the 15 elements of simple Dublin Core (as :mod:`.oai_dc` names them), each holding the
  values of ``dc:X`` and ``dcterms:X`` *and* of the DCMI refinements of X (the dumb-down
  rule: ``dcterms:abstract`` is also a ``description``, ``dcterms:isPartOf`` a
  ``relation``), so a qdc record reads like oai_dc there;
- every DCMI refinement and further term under its own snake_case key (``abstract``,
  ``issued``, ``is_part_of``, ``access_rights``, ``license``, ``rights_holder``, ...);
- ``identifiers``: ``{type, value}`` of each identifier, the type from its
  ``xsi:type`` (``dcterms:URI`` -> ``uri``) or from what its text shows (``doi``,
  ``handle``, ``urn``, ``isbn``, ``issn``, ``url``), None when neither says.

Values keep document order, are stripped; blank values are dropped.
"""

from __future__ import annotations

import re
from typing import Any

from lxml import etree

from ._util import TransformError, element_path, identifier_scheme, text_of
from .oai_dc import DC_ELEMENTS, DC_NS

DCTERMS_NS = "http://purl.org/dc/terms/"
_XSI_TYPE = "{http://www.w3.org/2001/XMLSchema-instance}type"

# DCMI refinement -> the element it refines (the dumb-down rule).
REFINES: dict[str, str] = {
    "alternative": "title",
    "abstract": "description", "tableOfContents": "description",
    "available": "date", "created": "date", "dateAccepted": "date",
    "dateCopyrighted": "date", "dateSubmitted": "date", "issued": "date",
    "modified": "date", "valid": "date",
    "extent": "format", "medium": "format",
    "bibliographicCitation": "identifier",
    "conformsTo": "relation", "hasFormat": "relation", "hasPart": "relation",
    "hasVersion": "relation", "isFormatOf": "relation", "isPartOf": "relation",
    "isReferencedBy": "relation", "isReplacedBy": "relation", "isRequiredBy": "relation",
    "isVersionOf": "relation", "references": "relation", "replaces": "relation",
    "requires": "relation",
    "spatial": "coverage", "temporal": "coverage",
    "accessRights": "rights", "license": "rights",
}
# DCMI terms that refine none of the 15 elements.
OTHER_TERMS = ("audience", "educationLevel", "mediator", "accrualMethod",
               "accrualPeriodicity", "accrualPolicy", "instructionalMethod", "provenance",
               "rightsHolder")


def snake(name: str) -> str:
    """``isPartOf`` -> ``is_part_of``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


KEYS: tuple[str, ...] = (*DC_ELEMENTS, *(snake(t) for t in (*REFINES, *OTHER_TERMS)),
                         "identifiers")
_DC = f"{{{DC_NS}}}"
_TERMS = f"{{{DCTERMS_NS}}}"


def _type_of(el: etree._Element, value: str) -> str | None:
    given = el.get(_XSI_TYPE)
    if given and given.strip():
        return given.strip().rpartition(":")[2].lower()
    return identifier_scheme(value)


def transform(root: etree._Element) -> dict[str, Any]:
    """Map a record holding ``dc:`` and ``dcterms:`` elements (see the module)."""
    out: dict[str, list[Any]] = {key: [] for key in KEYS}
    found = False
    for child in root.iter(f"{_DC}*", f"{_TERMS}*"):
        tag = child.tag
        assert isinstance(tag, str)
        local = tag.rpartition("}")[2]
        element = local if local in DC_ELEMENTS else REFINES.get(local)
        own = snake(local) if local not in DC_ELEMENTS else None
        if element is None and own not in out:
            continue
        found = True
        value = text_of(child)
        if value is None:
            continue
        if element is not None:
            out[element].append(value)
        if own is not None:
            out[own].append(value)
        if element == "identifier" and local == "identifier":
            out["identifiers"].append({"type": _type_of(child, value), "value": value})
    if not found:
        raise TransformError(
            "unexpected_format",
            f"expected qualified Dublin Core (dc: and dcterms: elements), got {root.tag!r}",
            element_path(root),
        )
    return out
