"""``mods``: a MODS record (Library of Congress, v3) to a flat, JSON-ready dict.

Namespace-agnostic (the MODS v3 namespace or none); a ``<modsCollection>`` yields its
first ``<mods>``. Every key is always present (lists ``[]``, scalars and dicts
``None`` when absent), so the schema is stable. Text is stripped, blank values dropped.

Keys: ``title`` (the first title without a type, else the first) and ``titles``
(``{title, type, lang}``; nonSort, title, subTitle, partNumber and partName joined);
``names`` (``{name, type, roles, identifiers, affiliations}``) and ``creators`` (the
names whose role is a creator's, ``aut``/``cre``/author/creator/originator..., or every
name when no name has a role); ``identifiers`` (``{type, value}``, an untyped one typed
by what its text shows) with ``doi``, ``isbn``, ``issn`` and ``urls`` (location urls)
picked out; ``dates`` (``{type, value, point, encoding, key_date}`` of originInfo) and
``date`` (the key date, else the first issued, created, captured or other date);
``publishers``, ``places``, ``edition``; ``subjects`` (``{value, kind, authority}``: a
subject's parts joined with ``--``), ``classifications``, ``genres``,
``types_of_resource``, ``languages`` (codes where given, else the terms' text);
``abstracts``, ``table_of_contents``, ``notes`` (``{type, value}``), ``extents``,
``forms``, ``media_types``; ``access_conditions`` (``{type, value}``) and ``rights``
(their texts); ``physical_locations``; ``related_items`` (``{type, title, identifiers,
part}``) and ``host`` (the first of type host), ``part`` (``{volume, issue, pages,
start_page, end_page, date}``); ``record_identifiers``, ``record_source`` and
``version`` (the root's MODS version).
"""

from __future__ import annotations

from typing import Any

from lxml import etree

from ._util import TransformError, attr, element_path, identifier_scheme, localname, text_of

_Element = etree._Element
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
_CREATOR_ROLES = frozenset({"aut", "cre", "author", "creator", "originator", "org",
                            "artist", "art", "photographer", "pht", "composer", "cmp"})
_DATES = ("dateIssued", "dateCreated", "dateCaptured", "dateValid", "dateModified",
          "copyrightDate", "dateOther")


def _kids(el: _Element, name: str | None = None) -> list[_Element]:
    """Element children (any namespace), those of local name `name` when given."""
    return [c for c in el if isinstance(c.tag, str)
            and (name is None or localname(c.tag) == name)]


def _texts(el: _Element, name: str) -> list[str]:
    return [t for c in _kids(el, name) if (t := text_of(c)) is not None]


def _find_mods(root: _Element) -> _Element:
    if isinstance(root.tag, str) and localname(root.tag) == "mods":
        return root
    for found in root.iter("{*}mods"):
        return found
    raise TransformError("unexpected_format",
                         f"expected a MODS <mods> (or a <modsCollection>), got {root.tag!r}",
                         element_path(root))


def _title(info: _Element) -> str | None:
    parts: list[str] = []
    for child in _kids(info):
        text = text_of(child)
        if text is None:
            continue
        name = localname(child.tag)
        if name == "nonSort":
            parts.append(text if text.endswith(("'", "-")) else text + " ")
        elif name == "title":
            parts.append(text)
        elif name == "subTitle":
            parts.append(f": {text}")
        elif name in ("partNumber", "partName"):
            parts.append(f". {text}")
    title = "".join(parts).strip()
    return title or None


def _titles(el: _Element) -> list[dict[str, Any]]:
    return [{"title": t, "type": attr(info, "type"), "lang": attr(info, "lang")
             or attr(info, _XML_LANG)}
            for info in _kids(el, "titleInfo") if (t := _title(info)) is not None]


def _identifiers(el: _Element) -> list[dict[str, Any]]:
    out = []
    for ident in _kids(el, "identifier"):
        value = text_of(ident)
        if value is not None:
            kind = attr(ident, "type")
            out.append({"type": kind.lower() if kind else identifier_scheme(value),
                        "value": value})
    return out


def _name(el: _Element) -> dict[str, Any] | None:
    parts = {attr(p, "type"): text_of(p) for p in _kids(el, "namePart")}
    given, family = parts.get("given"), parts.get("family")
    if given or family:
        name = ", ".join(p for p in (family, given) if p)
        extra = [v for k, v in parts.items() if k not in ("given", "family") and v]
        name = ", ".join([name, *extra])
    else:
        name = ", ".join(v for v in parts.values() if v)
    if not name:
        name = next(iter(_texts(el, "displayForm")), "")
    if not name:
        return None
    roles = [t for role in _kids(el, "role") for t in _texts(role, "roleTerm")]
    return {"name": name, "type": attr(el, "type"), "roles": roles,
            "identifiers": _texts(el, "nameIdentifier"),
            "affiliations": _texts(el, "affiliation")}


def _subject(el: _Element) -> dict[str, Any] | None:
    parts: list[str] = []
    kinds: list[str] = []
    for child in _kids(el):
        kind = localname(child.tag)
        if kind in ("name", "titleInfo"):
            named = _name(child) if kind == "name" else {"name": _title(child)}
            text = named["name"] if named else None
        elif kind == "hierarchicalGeographic":
            text = "--".join(t for c in _kids(child) if (t := text_of(c)) is not None) or None
        else:
            text = text_of(child)
        if text:
            parts.append(text)
            kinds.append(kind)
    if not parts:
        text = text_of(el)
        if text is None:
            return None
        parts = [text]
    return {"value": "--".join(parts), "kind": kinds[0] if len(set(kinds)) == 1 else None,
            "authority": attr(el, "authority")}


def _part(el: _Element | None) -> dict[str, Any] | None:
    if el is None:
        return None
    out: dict[str, Any] = {"volume": None, "issue": None, "pages": None, "start_page": None,
                           "end_page": None, "date": None}
    for detail in _kids(el, "detail"):
        kind = (attr(detail, "type") or "").lower()
        value = next(iter(_texts(detail, "number")), None) or text_of(detail)
        if kind in ("volume", "issue") and out[kind] is None:
            out[kind] = value
        elif kind in ("page", "pages") and out["start_page"] is None:
            out["start_page"] = value
    for extent in _kids(el, "extent"):
        start = next(iter(_texts(extent, "start")), None)
        end = next(iter(_texts(extent, "end")), None)
        out["start_page"] = out["start_page"] or start
        out["end_page"] = out["end_page"] or end
        out["pages"] = next(iter(_texts(extent, "list")), None) or (
            f"{start}-{end}" if start and end else None)
    out["date"] = next(iter(_texts(el, "date")), None)
    return out if any(v is not None for v in out.values()) else None


def _related(el: _Element) -> dict[str, Any]:
    titles = _titles(el)
    part = _kids(el, "part")
    return {"type": attr(el, "type") or attr(el, "otherType"),
            "title": titles[0]["title"] if titles else None,
            "identifiers": _identifiers(el),
            "urls": [t for loc in _kids(el, "location") for t in _texts(loc, "url")],
            "part": _part(part[0] if part else None)}


def _origin(info: _Element, out: dict[str, Any]) -> None:
    for child in _kids(info):
        name = localname(child.tag)
        text = text_of(child) if name != "place" else None
        if name in _DATES and text is not None:
            out["dates"].append({"type": name, "value": text, "point": attr(child, "point"),
                                 "encoding": attr(child, "encoding"),
                                 "key_date": attr(child, "keyDate") == "yes"})
        elif name == "publisher" and text is not None:
            out["publishers"].append(text)
        elif name == "edition" and text is not None and out["edition"] is None:
            out["edition"] = text
        elif name == "place":
            out["places"] += [t for term in _kids(child, "placeTerm")
                              if attr(term, "type") != "code" and (t := text_of(term))]


def _languages(mods: _Element) -> list[str]:
    out: list[str] = []
    for lang in _kids(mods, "language"):
        terms = _kids(lang, "languageTerm")
        codes = [t for term in terms if attr(term, "type") == "code" and (t := text_of(term))]
        for value in codes or [t for term in terms if (t := text_of(term))]:
            if value not in out:
                out.append(value)
    return out


def _date(dates: list[dict[str, Any]]) -> str | None:
    for d in dates:
        if d["key_date"]:
            return str(d["value"])
    for kind in _DATES:
        for d in dates:
            if d["type"] == kind and d["point"] != "end":
                return str(d["value"])
    return None


def transform(root: _Element) -> dict[str, Any]:
    """Map a MODS record (a ``<mods>``, or the first in a ``<modsCollection>``)."""
    mods = _find_mods(root)
    out: dict[str, Any] = {
        "title": None, "titles": _titles(mods), "names": [], "creators": [],
        "identifiers": _identifiers(mods), "doi": None, "isbn": [], "issn": [], "urls": [],
        "dates": [], "date": None, "publishers": [], "places": [], "edition": None,
        "subjects": [], "classifications": [], "genres": _texts(mods, "genre"),
        "types_of_resource": _texts(mods, "typeOfResource"), "languages": _languages(mods),
        "abstracts": _texts(mods, "abstract"),
        "table_of_contents": _texts(mods, "tableOfContents"),
        "notes": [], "extents": [], "forms": [], "media_types": [],
        "access_conditions": [], "rights": [], "physical_locations": [],
        "related_items": [], "host": None, "part": None, "record_identifiers": [],
        "record_source": None, "version": attr(mods, "version"),
    }
    for child in _kids(mods):
        name = localname(child.tag)
        if name == "name":
            named = _name(child)
            if named is not None:
                out["names"].append(named)
        elif name == "originInfo":
            _origin(child, out)
        elif name == "subject":
            subject = _subject(child)
            if subject is not None:
                out["subjects"].append(subject)
        elif name == "classification" and (text := text_of(child)):
            out["classifications"].append({"value": text, "authority": attr(child, "authority")})
        elif name == "note" and (text := text_of(child)):
            out["notes"].append({"type": attr(child, "type"), "value": text})
        elif name == "physicalDescription":
            out["extents"] += _texts(child, "extent")
            out["forms"] += _texts(child, "form")
            out["media_types"] += _texts(child, "internetMediaType")
        elif name == "accessCondition" and (text := text_of(child)):
            out["access_conditions"].append({"type": attr(child, "type"), "value": text})
            out["rights"].append(text)
        elif name == "location":
            out["urls"] += _texts(child, "url")
            out["physical_locations"] += _texts(child, "physicalLocation")
            if not _kids(child) and (text := text_of(child)):
                out["physical_locations"].append(text)
        elif name == "relatedItem":
            out["related_items"].append(_related(child))
        elif name == "part" and out["part"] is None:
            out["part"] = _part(child)
        elif name == "recordInfo":
            out["record_identifiers"] += _texts(child, "recordIdentifier")
            out["record_source"] = out["record_source"] or next(
                iter(_texts(child, "recordContentSource")), None)
    titles = out["titles"]
    if titles:
        out["title"] = next((t["title"] for t in titles if t["type"] is None),
                            titles[0]["title"])
    named = out["names"]
    with_roles = [n for n in named if n["roles"]]
    out["creators"] = [n["name"] for n in named
                       if not with_roles or {r.lower() for r in n["roles"]} & _CREATOR_ROLES]
    for ident in out["identifiers"]:
        kind, value = ident["type"], ident["value"]
        if kind == "doi" and out["doi"] is None:
            out["doi"] = value
        elif kind in ("isbn", "issn"):
            out[kind].append(value)
    out["date"] = _date(out["dates"])
    out["host"] = next((r for r in out["related_items"] if r["type"] == "host"), None)
    return out
