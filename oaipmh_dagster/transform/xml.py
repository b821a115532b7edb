"""``xml``: the generic mapping of any metadata format: element path -> text values.

:func:`transform` (the ``xml`` transformer) gives a flat dict whose keys are the paths
of the record's elements in local names from its root (``mods/titleInfo/title``) and
whose values are the stripped, non-blank texts of the elements at that path, in document
order. An element that holds other elements has a key only when it also holds text of
its own (mixed content: its value is all its text); an empty leaf has a key with ``[]``.
Attributes are ``path/@name`` (``xml:`` and ``xsi:`` attributes keep their prefix,
other namespaced attributes are named by their local name; ``xsi:schemaLocation`` is
left out).
Comments and processing instructions are left out.

:func:`lossless` is the mapping earlier versions stored (rows of that shape are still in
stores: :func:`readable` reads them as element paths). Each element becomes::

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

from ._util import texts

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


_XML_NS = "{http://www.w3.org/XML/1998/namespace}"
_XSI_NS = "{http://www.w3.org/2001/XMLSchema-instance}"
_SKIPPED = {f"{_XSI_NS}schemaLocation", f"{_XSI_NS}noNamespaceSchemaLocation"}


def _attribute_name(name: str) -> str | None:
    if name in _SKIPPED:
        return None
    if name.startswith(_XML_NS):
        return "xml:" + name[len(_XML_NS):]
    if name.startswith(_XSI_NS):  # xsi:type beside a type of the element's own
        return "xsi:" + name[len(_XSI_NS):]
    return name.rpartition("}")[2]


def _paths(el: etree._Element, path: str, out: dict[str, list[str]],
           names: dict[str, str]) -> None:
    """Add `el` (at `path`) and its subtree to `out`; `names`: local names by tag (and
    shown attribute names by ``@`` and the attribute's name)."""
    attrib = el.attrib
    if attrib:
        for name, value in attrib.items():
            key = "@" + str(name)  # cached as "" when the attribute is left out
            shown = names.get(key)
            if shown is None:
                shown = names[key] = _attribute_name(str(name)) or ""
            value = str(value).strip()
            if shown and value:
                out.setdefault(f"{path}/@{shown}", []).append(value)
    text = el.text
    if not len(el):  # a leaf: a key even when blank
        values = out.setdefault(path, [])
        if text and (text := text.strip()):
            values.append(text)
        return
    # The key goes before the children's (document order); it is dropped again when the
    # element turns out to hold elements only.
    created = path not in out
    values = out.setdefault(path, [])
    mixed = bool(text and not text.isspace())
    elements = False
    for child in el:
        tag = child.tag
        if tag.__class__ is str:
            elements = True
            local = names.get(tag)
            if local is None:
                local = names[tag] = tag.rpartition("}")[2]
            _paths(child, f"{path}/{local}", out, names)
        if not mixed:
            tail = child.tail
            mixed = bool(tail and not tail.isspace())
    if mixed or not elements:  # text of its own, or only comments and PIs: a leaf
        value = "".join(texts(el)).strip()
        if value:
            values.append(value)
    elif created:
        del out[path]


def transform(root: etree._Element) -> dict[str, list[str]]:
    """Map ``root`` to element path -> text values; see the module docstring."""
    out: dict[str, list[str]] = {}
    _paths(root, str(root.tag).rpartition("}")[2], out, {})
    return out


def lossless(root: etree._Element) -> dict[str, Any]:
    """Map ``root`` losslessly (the shape earlier versions stored)."""
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
    """Rebuild the element tree that :func:`lossless` mapped to ``d``."""
    nsmap = {prefix or None: uri for prefix, uri in (d.get("nsmap") or {}).items()}
    return _build(None, d, nsmap or None)


def is_lossless(metadata: Any) -> bool:
    """Whether stored metadata has the shape of :func:`lossless` (rows of earlier
    versions of the generic mapping)."""
    return (isinstance(metadata, dict) and isinstance(metadata.get("tag"), str)
            and "nsmap" in metadata and isinstance(metadata.get("children", []), list))


def _rebuild(parent: etree._Element | None, d: Any) -> etree._Element | None:
    """The element of a lossless dict, skipping what cannot be an element."""
    try:
        attributes = {k: v for k, v in (d.get("attributes") or {}).items()
                      if isinstance(k, str) and isinstance(v, str)}
        el = (etree.Element(d["tag"], attributes) if parent is None
              else etree.SubElement(parent, d["tag"], attributes))
    except (TypeError, ValueError, AttributeError, KeyError):
        return None
    text = d.get("text")
    el.text = text if isinstance(text, str) else None
    last: etree._Element | None = None
    for child in d.get("children") or ():
        if isinstance(child, str):
            if last is None:
                el.text = (el.text or "") + child
            else:
                last.tail = (last.tail or "") + child
        elif isinstance(child, dict) and isinstance(child.get("tag"), str):
            built = _rebuild(el, child)
            last = built if built is not None else last
    return el


def readable(metadata: Any) -> Any:
    """Stored metadata as it is read: a row of the lossless shape as element paths
    (what :func:`transform` gives the same record, less comments' text), any other
    value unchanged."""
    if not is_lossless(metadata):
        return metadata
    root = _rebuild(None, metadata)
    return {} if root is None else transform(root)
