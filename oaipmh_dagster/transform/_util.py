"""Small helpers shared by the transformers: text extraction, names, error locations."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import cast

from lxml import etree

from oaipmh_dagster.errors import OAIPMHDagsterError

_Element = etree._Element


class TransformError(OAIPMHDagsterError, ValueError):
    """A record could not be transformed, or a transformer could not be resolved.

    ``type`` is a short machine-readable category (``xml_syntax``,
    ``unknown_transformer``, ``bad_plugin``, ``unexpected_format``, ``invalid_record``,
    ``transform_failed``, ``bad_output``); ``location`` points at the failure: an
    XPath-like path of the failing element, a line/column, or the transformer name.
    """

    def __init__(self, type: str, message: str, location: str | None = None) -> None:
        super().__init__(message)
        self.type = type
        self.message = message
        self.location = location

    def to_dict(self) -> dict[str, str | None]:
        """JSON-ready form, as stored with a record's errors."""
        return {"type": self.type, "message": self.message, "location": self.location}

    def __reduce__(self) -> tuple[type[TransformError], tuple[str, str, str | None]]:
        return (type(self), (self.type, self.message, self.location))

    def __str__(self) -> str:
        where = f" (at {self.location})" if self.location else ""
        return f"{self.type}: {self.message}{where}"

    def __repr__(self) -> str:
        return f"TransformError({self.type!r}, {self.message!r}, {self.location!r})"


def clean(value: str | None) -> str | None:
    """Strip surrounding whitespace; ``None`` for missing or blank values."""
    if value is None:
        return None
    value = value.strip()
    return value or None


def texts(el: etree._Element) -> Iterator[str]:
    """The text nodes of `el` (lxml gives str for parsed XML)."""
    return cast(Iterator[str], el.itertext())


def text_of(el: _Element) -> str | None:
    """The element's text (including any child text), stripped; ``None`` when blank."""
    value = "".join(texts(el)) if len(el) else el.text
    if value:
        value = value.strip()
    return value or None


def attr(el: _Element, name: str) -> str | None:
    """An attribute value, stripped; ``None`` when absent or blank."""
    value = el.get(name)
    if value:
        value = value.strip()
    return value or None


def localname(tag: str) -> str:
    """Local part of a Clark-notation tag (``{ns}name`` -> ``name``)."""
    return tag.rpartition("}")[2]


def namespace_of(tag: str) -> str | None:
    """Namespace URI of a Clark-notation tag, or ``None`` when it has none."""
    return tag[1:].partition("}")[0] if tag[:1] == "{" else None


def element_path(el: _Element) -> str:
    """A readable XPath-like location of ``el``: ``/oai_dc:dc/dc:title[2]``.

    Each step uses the element's own prefix (none for the default namespace) and a
    1-based position among siblings with the same tag when there is more than one.
    """
    steps: list[str] = []
    node: _Element | None = el
    while node is not None:
        tag = node.tag
        if not isinstance(tag, str):  # comment or processing instruction
            step = "node()"
        else:
            prefix = node.prefix
            name = localname(tag)
            step = f"{prefix}:{name}" if prefix else name
            parent = node.getparent()
            if parent is not None:
                same = list(parent.iterchildren(tag))
                if len(same) > 1:
                    step += f"[{same.index(node) + 1}]"
        steps.append(step)
        node = node.getparent()
    return "/" + "/".join(reversed(steps))



_SCHEMES = (
    ("doi", re.compile(r"^(?:doi:\s*|https?://(?:dx\.)?doi\.org/)?10\.\d{4,9}/\S+$", re.I)),
    ("handle", re.compile(r"^(?:hdl:|https?://hdl\.handle\.net/)\d[\w.]*/\S+$", re.I)),
    ("urn", re.compile(r"^urn:[a-z0-9][a-z0-9-]{0,31}:\S+$", re.I)),
    ("issn", re.compile(r"^(?:issn:?\s*)?\d{4}-\d{3}[\dX]$", re.I)),
    ("isbn", re.compile(r"^(?:isbn(?:-1[03])?:?\s*)?(?:\d[- ]?){9}[\dX]$"
                        r"|^(?:isbn(?:-1[03])?:?\s*)?97[89](?:[- ]?\d){10}$", re.I)),
    ("url", re.compile(r"^https?://\S+$", re.I)),
)


def identifier_scheme(value: str) -> str | None:
    """The scheme an identifier's text shows (``doi``, ``handle``, ``urn``, ``issn``,
    ``isbn``, ``url``), None when it shows none: for identifiers their record does not
    type."""
    value = value.strip()
    return next((name for name, pattern in _SCHEMES if pattern.match(value)), None)
