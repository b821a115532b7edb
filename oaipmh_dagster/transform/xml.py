"""``xml``: a generic, lossless element-to-dict mapping for any metadata format.

Each element becomes::

    {"tag": "{namespace}local",          # Clark notation; no namespace -> "local"
     "attributes": {"{ns}name": "v"},    # only when present; names in Clark notation
     "text": "leading text",             # only when present
     "children": [ ... ]}                # only when present, in document order

``children`` holds element dicts, text strings (the text that follows a child, so no
element carries a tail) and, when present, ``{"comment": text}``,
``{"pi": target, "text": text}`` and ``{"entity": name}``. The top-level dict also
has ``nsmap`` (``{prefix: uri}``, ``""`` for the default namespace) so that
:func:`dict_to_xml` restores the original prefixes.

Text is kept verbatim, except the whitespace that only indents element-only content
(an element whose children are separated by nothing but whitespace); that is the
one thing a round trip through :func:`dict_to_xml` does not restore.
"""

from __future__ import annotations

from typing import Any

from lxml import etree

_Comment = etree.Comment
_PI = etree.ProcessingInstruction
_Entity = etree.Entity


def _special(node: etree._Element) -> dict[str, Any]:
    """A comment, processing instruction or unresolved entity reference."""
    tag = node.tag
    if tag is _Comment:
        return {"comment": node.text or ""}
    special: Any = node  # a _ProcessingInstruction or an _Entity
    if tag is _PI:
        return {"pi": special.target, "text": node.text}
    if tag is _Entity:
        return {"entity": special.name}
    raise TypeError(f"unexpected node {node!r}")


def element_to_dict(el: etree._Element) -> dict[str, Any]:
    """Map one element and its subtree (without ``nsmap``)."""
    out: dict[str, Any] = {"tag": el.tag}
    attrib = el.attrib
    if attrib:
        out["attributes"] = dict(attrib)
    text = el.text
    if not len(el):
        if text:
            out["text"] = text
        return out
    mixed = bool(text and not text.isspace())
    children: list[Any] = []
    for child in el:
        children.append(element_to_dict(child) if type(child.tag) is str else _special(child))
        tail = child.tail
        if tail:
            children.append(tail)
            if not mixed and not tail.isspace():
                mixed = True
    if mixed:
        if text:
            out["text"] = text
    else:
        children = [c for c in children if not isinstance(c, str)]
    out["children"] = children
    return out


def transform(root: etree._Element) -> dict[str, Any]:
    """Map ``root`` losslessly; see the module docstring for the shape."""
    out = element_to_dict(root)
    out["nsmap"] = {prefix or "": uri for prefix, uri in root.nsmap.items()}
    return out


def _build(parent: etree._Element | None, d: dict[str, Any], nsmap: Any = None) -> etree._Element:
    attributes = d.get("attributes") or {}
    if parent is None:
        el = etree.Element(d["tag"], attributes, nsmap=nsmap)
    else:
        el = etree.SubElement(parent, d["tag"], attributes)
    el.text = d.get("text")
    last: etree._Element | None = None
    for child in d.get("children", ()):
        if isinstance(child, str):
            if last is None:
                el.text = (el.text or "") + child
            else:
                last.tail = (last.tail or "") + child
            continue
        if "tag" in child:
            last = _build(el, child)
            continue
        if "comment" in child:
            last = etree.Comment(child["comment"])
        elif "pi" in child:
            last = etree.ProcessingInstruction(child["pi"], child.get("text"))
        elif "entity" in child:
            last = etree.Entity(child["entity"])
        else:
            raise ValueError(f"unknown node in children: {child!r}")
        el.append(last)
    return el


def dict_to_xml(d: dict[str, Any]) -> etree._Element:
    """Rebuild the element tree that :func:`transform` mapped to ``d``."""
    nsmap = {prefix or None: uri for prefix, uri in (d.get("nsmap") or {}).items()}
    return _build(None, d, nsmap or None)
