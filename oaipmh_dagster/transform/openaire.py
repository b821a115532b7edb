"""``oai_openaire``: a record of the OpenAIRE Guidelines for Literature Repositories
(v4, ``<oaire:resource>`` holding ``datacite:``, ``dc:``, ``dcterms:`` and ``oaire:``
elements) to a flat, JSON-ready dict.

Elements are matched by local name, whatever their namespace (the Guidelines mix
four). Every key is always present (lists ``[]``, scalars and dicts ``None``), text is
stripped and blank values dropped. Keys:

``title``, ``titles`` (``{title, type, lang}``); ``creators`` and ``contributors``
(``{name, name_type, given_name, family_name, identifiers: [{scheme, value}],
affiliations}``, contributors with their ``type``); ``creator_names``; ``identifier``
and ``identifier_type`` (the resource's own), ``alternate_identifiers`` and
``related_identifiers`` (``{type, value}``, related ones with their ``relation``),
``doi``; ``dates`` (``{type, value}``) and ``date_issued``; ``languages``,
``publishers``, ``resource_type`` (its label), ``resource_type_general``,
``resource_type_uri``; ``descriptions``, ``formats``, ``sizes``, ``subjects``
(``{value, scheme, scheme_uri, value_uri}``); ``access_rights`` (label) and
``access_rights_uri`` (COAR), ``license_conditions`` (``{value, uri, start_date}``);
``version`` and ``version_uri``; ``funding_references`` (``{funder_name,
funder_identifier, funder_identifier_type, funding_stream, award_number, award_uri,
award_title}``); ``files`` (``{url, mime_type, object_type, access_rights_uri}``);
``citation`` (``{title, volume, issue, start_page, end_page, edition,
conference_place, conference_date}``: the host the resource appeared in);
``audiences``, ``coverages``.
"""

from __future__ import annotations

from typing import Any

from lxml import etree

from ._util import TransformError, attr, element_path, localname, text_of

OAIRE_NS = "http://namespace.openaire.eu/schema/oaire/"
_Element = etree._Element
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
_CITATION = {"citationTitle": "title", "citationVolume": "volume", "citationIssue": "issue",
             "citationStartPage": "start_page", "citationEndPage": "end_page",
             "citationEdition": "edition", "citationConferencePlace": "conference_place",
             "citationConferenceDate": "conference_date"}


def _kids(el: _Element, name: str | None = None) -> list[_Element]:
    return [c for c in el if isinstance(c.tag, str)
            and (name is None or localname(c.tag) == name)]


def _first(el: _Element, name: str) -> str | None:
    return next((t for c in _kids(el, name) if (t := text_of(c)) is not None), None)


def _agent(el: _Element, name_tag: str) -> dict[str, Any] | None:
    name_el = next(iter(_kids(el, name_tag)), None)
    given, family = _first(el, "givenName"), _first(el, "familyName")
    name = text_of(name_el) if name_el is not None else None
    if name is None and (given or family):
        name = ", ".join(p for p in (family, given) if p)
    if name is None:
        return None
    return {
        "name": name,
        "name_type": attr(name_el, "nameType") if name_el is not None else None,
        "given_name": given, "family_name": family,
        "identifiers": [{"scheme": attr(i, "nameIdentifierScheme"), "value": v}
                        for i in _kids(el, "nameIdentifier") if (v := text_of(i))],
        "affiliations": [v for a in _kids(el, "affiliation") if (v := text_of(a))],
    }


def _funding(el: _Element) -> dict[str, Any]:
    funder = next(iter(_kids(el, "funderIdentifier")), None)
    award = next(iter(_kids(el, "awardNumber")), None)
    return {
        "funder_name": _first(el, "funderName"),
        "funder_identifier": text_of(funder) if funder is not None else None,
        "funder_identifier_type": attr(funder, "funderIdentifierType")
        if funder is not None else None,
        "funding_stream": _first(el, "fundingStream"),
        "award_number": text_of(award) if award is not None else None,
        "award_uri": attr(award, "awardURI") if award is not None else None,
        "award_title": _first(el, "awardTitle"),
    }


def _find_resource(root: _Element) -> _Element:
    if isinstance(root.tag, str) and localname(root.tag) == "resource":
        return root
    for found in root.iter(f"{{{OAIRE_NS}}}resource"):
        return found
    raise TransformError("unexpected_format",
                         f"expected an OpenAIRE <oaire:resource>, got {root.tag!r}",
                         element_path(root))


def _empty() -> dict[str, Any]:
    return {
        "title": None, "titles": [], "creators": [], "creator_names": [], "contributors": [],
        "identifier": None, "identifier_type": None, "doi": None,
        "alternate_identifiers": [], "related_identifiers": [], "dates": [],
        "date_issued": None, "languages": [], "publishers": [], "resource_type": None,
        "resource_type_general": None, "resource_type_uri": None, "descriptions": [],
        "formats": [], "sizes": [], "subjects": [], "access_rights": None,
        "access_rights_uri": None, "license_conditions": [], "version": None,
        "version_uri": None, "funding_references": [], "files": [], "citation": None,
        "audiences": [], "coverages": [],
    }


def _container(name: str, el: _Element, out: dict[str, Any]) -> bool:
    """Fill `out` from a container element (titles, creators, ...); False when `name`
    is none."""
    if name == "titles":
        out["titles"] += [{"title": t, "type": attr(c, "titleType"),
                           "lang": attr(c, _XML_LANG)}
                          for c in _kids(el, "title") if (t := text_of(c))]
    elif name in ("creators", "contributors"):
        single = name[:-1]
        for c in _kids(el, single):
            agent = _agent(c, f"{single}Name")
            if agent is not None:
                if single == "contributor":
                    agent["type"] = attr(c, "contributorType")
                out[name].append(agent)
    elif name == "alternateIdentifiers":
        out["alternate_identifiers"] += [
            {"type": attr(c, "alternateIdentifierType"), "value": v}
            for c in _kids(el, "alternateIdentifier") if (v := text_of(c))]
    elif name == "relatedIdentifiers":
        out["related_identifiers"] += [
            {"type": attr(c, "relatedIdentifierType"), "relation": attr(c, "relationType"),
             "value": v} for c in _kids(el, "relatedIdentifier") if (v := text_of(c))]
    elif name == "dates":
        out["dates"] += [{"type": attr(c, "dateType"), "value": v}
                         for c in _kids(el, "date") if (v := text_of(c))]
    elif name == "subjects":
        out["subjects"] += [{"value": v, "scheme": attr(c, "subjectScheme"),
                             "scheme_uri": attr(c, "schemeURI"),
                             "value_uri": attr(c, "valueURI")}
                            for c in _kids(el, "subject") if (v := text_of(c))]
    elif name == "sizes":
        out["sizes"] += [v for c in _kids(el, "size") if (v := text_of(c))]
    elif name == "fundingReferences":
        out["funding_references"] += [_funding(c) for c in _kids(el, "fundingReference")]
    else:
        return False
    return True


def _leaf(name: str, el: _Element, out: dict[str, Any]) -> None:
    """Fill `out` from an element that holds a value."""
    value = text_of(el)
    if name == "identifier" and value and out["identifier"] is None:
        out["identifier"], out["identifier_type"] = value, attr(el, "identifierType")
    elif name == "rights" and out["access_rights"] is None:
        out["access_rights"], out["access_rights_uri"] = value, attr(el, "rightsURI")
    elif name == "resourceType":
        out["resource_type"] = value
        out["resource_type_general"] = attr(el, "resourceTypeGeneral")
        out["resource_type_uri"] = attr(el, "uri")
    elif name == "version":
        out["version"], out["version_uri"] = value, attr(el, "uri")
    elif name == "licenseCondition" and (value or attr(el, "uri")):
        out["license_conditions"].append({"value": value, "uri": attr(el, "uri"),
                                          "start_date": attr(el, "startDate")})
    elif name == "file" and value:
        out["files"].append({"url": value, "mime_type": attr(el, "mimeType"),
                             "object_type": attr(el, "objectType"),
                             "access_rights_uri": attr(el, "accessRightsURI")})
    elif name in _CITATION and value:
        citation = out["citation"] = out["citation"] or dict.fromkeys(_CITATION.values())
        citation[_CITATION[name]] = citation[_CITATION[name]] or value
    elif value:
        key = {"language": "languages", "publisher": "publishers",
               "description": "descriptions", "format": "formats",
               "audience": "audiences", "coverage": "coverages"}.get(name)
        if key is not None:
            out[key].append(value)


def transform(root: _Element) -> dict[str, Any]:
    """Map an ``oaire:resource`` (OpenAIRE Guidelines for Literature Repositories v4)."""
    resource = _find_resource(root)
    out = _empty()
    for child in _kids(resource):
        name = localname(child.tag)
        if not _container(name, child, out):
            _leaf(name, child, out)
    titles = out["titles"]
    if titles:
        out["title"] = next((t["title"] for t in titles if t["type"] is None),
                            titles[0]["title"])
    out["creator_names"] = [c["name"] for c in out["creators"]]
    if (out["identifier_type"] or "").lower() == "doi":
        out["doi"] = out["identifier"]
    else:
        out["doi"] = next((i["value"] for i in out["alternate_identifiers"]
                           if (i["type"] or "").lower() == "doi"), None)
    out["date_issued"] = next((d["value"] for d in out["dates"] if d["type"] == "Issued"),
                              None)
    return out
