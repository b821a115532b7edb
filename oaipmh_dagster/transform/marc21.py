"""``marc21`` / ``marcxml``: a MARCXML record to a dict.

Keys: ``leader``, ``control_fields`` (``[{"tag", "value"}]``), ``data_fields``
(``[{"tag", "ind1", "ind2", "subfields": [{"code", "value"}]}]``), all in document
order, plus the conveniences ``title`` (245 $a $b), ``author`` (100 or 110 $a),
``isbn`` (020 $a) and ``issn`` (022 $a).

The leader and control fields are fixed-position data, so their values are kept
verbatim (no stripping). Indicators are single characters where a blank is ``" "``.
Subfield values are stripped and blank subfields dropped. Works with the MARC21 slim
namespace and with un-namespaced MARCXML; a ``<collection>`` yields its first record.
"""

from __future__ import annotations

from typing import Any

from lxml import etree

from ._util import TransformError, clean, element_path, localname, texts

MARC_NS = "http://www.loc.gov/MARC21/slim"
_ANY_RECORD = "{*}record"
_TRAILING_PUNCT = " /:;,=."


def _find_record(root: etree._Element) -> etree._Element:
    if localname(root.tag) == "record":
        return root
    for found in root.iter(_ANY_RECORD):
        return found
    raise TransformError(
        "unexpected_format",
        f"expected a MARCXML <record> (or a <collection> holding one), got {root.tag!r}",
        element_path(root),
    )


def _indicator(value: str | None) -> str:
    return value if value and value.strip() else " "


def _required_tag(el: etree._Element) -> str:
    tag = clean(el.get("tag"))
    if tag is None:
        raise TransformError(
            "invalid_record", f"<{localname(el.tag)}> without a tag attribute", element_path(el)
        )
    return tag


def _first_subfield(field: dict[str, Any], code: str) -> str | None:
    for sub in field["subfields"]:
        if sub["code"] == code:
            return sub["value"]
    return None


def _trim(value: str | None) -> str | None:
    """Drop the ISBD punctuation that closes a MARC subfield (``"Title :"`` -> ``"Title"``)."""
    return clean(value.rstrip(_TRAILING_PUNCT)) if value is not None else None


def transform(root: etree._Element) -> dict[str, Any]:
    """Map a MARCXML record."""
    record = _find_record(root)
    leader: str | None = None
    control_fields: list[dict[str, str | None]] = []
    data_fields: list[dict[str, Any]] = []
    title: str | None = None
    author: str | None = None
    isbn: list[str] = []
    issn: list[str] = []

    for child in record.iterchildren(tag=etree.Element):
        name = localname(child.tag)
        if name == "datafield":
            tag = _required_tag(child)
            subfields: list[dict[str, str]] = []
            for sub in child.iterchildren("{*}subfield"):
                value = clean("".join(texts(sub)) if len(sub) else sub.text)
                if value is not None:
                    subfields.append({"code": sub.get("code") or "", "value": value})
            field = {
                "tag": tag,
                "ind1": _indicator(child.get("ind1")),
                "ind2": _indicator(child.get("ind2")),
                "subfields": subfields,
            }
            data_fields.append(field)
            if tag == "245" and title is None:
                parts = [p for p in (_first_subfield(field, "a"), _first_subfield(field, "b")) if p]
                title = _trim(" ".join(parts)) if parts else None
            elif tag in ("100", "110") and author is None:
                author = _trim(_first_subfield(field, "a"))
            elif tag == "020" or tag == "022":
                target = isbn if tag == "020" else issn
                for entry in subfields:
                    if entry["code"] == "a" and entry["value"].split():
                        target.append(entry["value"].split()[0])
        elif name == "controlfield":
            control_fields.append({"tag": _required_tag(child), "value": child.text or None})
        elif name == "leader":
            leader = child.text or None

    return {
        "leader": leader,
        "control_fields": control_fields,
        "data_fields": data_fields,
        "title": title,
        "author": author,
        "isbn": isbn,
        "issn": issn,
    }
