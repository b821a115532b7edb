"""``datacite``: a DataCite ``<resource>`` to a flat, JSON-ready dict.

Namespace-agnostic: kernel-2.x, kernel-3, kernel-4 and un-namespaced resources all
map the same way (tag names are precomputed once per namespace, so no per-record
XPath or name splitting). The ``oai_datacite`` wrapper
(``<oai_datacite><payload><resource>``, as Zenodo serves it) is unwrapped by the
format table's rule (:func:`oaipmh_dagster.formats.unwrap`), the one validation uses.

Every key is always present, so the schema is stable: lists are ``[]`` and scalars
``None`` when the record lacks them. Text is stripped; blank values become ``None``
and blank list items are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from lxml import etree

from oaipmh_dagster.formats import unwrap

from ._util import (
    TransformError,
    attr,
    element_path,
    localname,
    namespace_of,
    text_of,
    texts,
)

_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"

_Element = etree._Element
_Out = dict[str, Any]


class _Schema:
    """Tag names of one DataCite namespace and the handlers keyed by them."""

    def __init__(self, ns: str | None) -> None:
        q = (lambda name: f"{{{ns}}}{name}") if ns else (lambda name: name)
        self.creator = q("creator")
        self.creator_name = q("creatorName")
        self.contributor = q("contributor")
        self.contributor_name = q("contributorName")
        self.given_name = q("givenName")
        self.family_name = q("familyName")
        self.name_identifier = q("nameIdentifier")
        self.affiliation = q("affiliation")
        self.title = q("title")
        self.alternate_identifier = q("alternateIdentifier")
        self.date = q("date")
        self.subject = q("subject")
        self.rights = q("rights")
        self.description = q("description")
        self.br = q("br")
        self.related_identifier = q("relatedIdentifier")
        self.format = q("format")
        self.size = q("size")
        self.funding_reference = q("fundingReference")
        self.funding_fields = {
            q("funderName"): ("funder_name", None, None),
            q("funderIdentifier"): (
                "funder_identifier",
                "funder_identifier_type",
                "funderIdentifierType",
            ),
            q("awardNumber"): ("award_number", "award_uri", "awardURI"),
            q("awardTitle"): ("award_title", None, None),
        }
        self.handlers: dict[str, Callable[[_Element, _Out], None]] = {
            q("identifier"): self.identifier,
            q("alternateIdentifiers"): self.alternate_identifiers,
            q("creators"): self.creators,
            q("contributors"): self.contributors,
            q("titles"): self.titles,
            q("publisher"): self.publisher,
            q("publicationYear"): self.publication_year,
            q("dates"): self.dates,
            q("resourceType"): self.resource_type,
            q("subjects"): self.subjects,
            q("rightsList"): self.rights_list,
            q("descriptions"): self.descriptions,
            q("relatedIdentifiers"): self.related_identifiers,
            q("language"): self.language,
            q("version"): self.version,
            q("formats"): self.formats,
            q("sizes"): self.sizes,
            q("fundingReferences"): self.funding_references,
        }

    def person(self, el: _Element, name_tag: str) -> dict[str, Any]:
        """A ``creator`` or ``contributor``; ``name_tag`` is its name element's tag."""
        name = name_type = given = family = None
        identifiers: list[dict[str, str | None]] = []
        affiliations: list[dict[str, str | None]] = []
        for child in el:
            tag = child.tag
            if tag == name_tag:
                name = text_of(child)
                name_type = attr(child, "nameType")
            elif tag == self.given_name:
                given = text_of(child)
            elif tag == self.family_name:
                family = text_of(child)
            elif tag == self.name_identifier:
                value = text_of(child)
                if value is not None:
                    identifiers.append(
                        {
                            "identifier": value,
                            "scheme": attr(child, "nameIdentifierScheme"),
                            "scheme_uri": attr(child, "schemeURI"),
                        }
                    )
            elif tag == self.affiliation:
                value = text_of(child)
                identifier = attr(child, "affiliationIdentifier")
                if value is not None or identifier is not None:
                    affiliations.append(
                        {
                            "name": value,
                            "identifier": identifier,
                            "scheme": attr(child, "affiliationIdentifierScheme"),
                        }
                    )
        return {
            "name": name,
            "name_type": name_type,
            "given_name": given,
            "family_name": family,
            "name_identifiers": identifiers,
            "affiliations": affiliations,
        }

    def creators(self, el: _Element, out: _Out) -> None:
        name_tag = self.creator_name
        out["creators"].extend(self.person(c, name_tag) for c in el.iterchildren(self.creator))

    def contributors(self, el: _Element, out: _Out) -> None:
        name_tag = self.contributor_name
        for c in el.iterchildren(self.contributor):
            person = self.person(c, name_tag)
            person["contributor_type"] = attr(c, "contributorType")
            out["contributors"].append(person)

    def titles(self, el: _Element, out: _Out) -> None:
        append = out["titles"].append
        for t in el.iterchildren(self.title):
            value = text_of(t)
            if value is not None:
                append(
                    {"title": value, "title_type": attr(t, "titleType"), "lang": attr(t, _XML_LANG)}
                )

    def identifier(self, el: _Element, out: _Out) -> None:
        value = text_of(el)
        if value is None:
            return
        kind = attr(el, "identifierType")
        out["identifiers"].insert(0, {"identifier": value, "identifier_type": kind})
        if kind is not None and kind.upper() == "DOI":
            out["doi"] = value

    def alternate_identifiers(self, el: _Element, out: _Out) -> None:
        append = out["identifiers"].append
        for a in el.iterchildren(self.alternate_identifier):
            value = text_of(a)
            if value is not None:
                append({"identifier": value, "identifier_type": attr(a, "alternateIdentifierType")})

    def dates(self, el: _Element, out: _Out) -> None:
        append = out["dates"].append
        for d in el.iterchildren(self.date):
            value = text_of(d)
            if value is not None:
                append(
                    {
                        "date": value,
                        "date_type": attr(d, "dateType"),
                        "information": attr(d, "dateInformation"),
                    }
                )

    def resource_type(self, el: _Element, out: _Out) -> None:
        out["types"] = {
            "resource_type_general": attr(el, "resourceTypeGeneral"),
            "resource_type": text_of(el),
        }

    def subjects(self, el: _Element, out: _Out) -> None:
        append = out["subjects"].append
        for s in el.iterchildren(self.subject):
            value = text_of(s)
            if value is not None:
                append(
                    {
                        "subject": value,
                        "scheme": attr(s, "subjectScheme"),
                        "scheme_uri": attr(s, "schemeURI"),
                        "value_uri": attr(s, "valueURI"),
                        "classification_code": attr(s, "classificationCode"),
                        "lang": attr(s, _XML_LANG),
                    }
                )

    def rights_list(self, el: _Element, out: _Out) -> None:
        append = out["rights"].append
        for r in el.iterchildren(self.rights):
            value = text_of(r)
            uri = attr(r, "rightsURI")
            if value is not None or uri is not None:
                append(
                    {
                        "rights": value,
                        "uri": uri,
                        "identifier": attr(r, "rightsIdentifier"),
                        "identifier_scheme": attr(r, "rightsIdentifierScheme"),
                        "lang": attr(r, _XML_LANG),
                    }
                )

    def description_text(self, el: _Element) -> str | None:
        """Description text with ``<br/>`` turned into line breaks."""
        if not len(el):
            return text_of(el)
        parts = [el.text or ""]
        for child in el:
            if child.tag == self.br:
                parts.append("\n")
            elif isinstance(child.tag, str):
                parts.append("".join(texts(child)))
            parts.append(child.tail or "")
        return "".join(parts).strip() or None

    def descriptions(self, el: _Element, out: _Out) -> None:
        append = out["descriptions"].append
        for d in el.iterchildren(self.description):
            value = self.description_text(d)
            if value is not None:
                append(
                    {
                        "description": value,
                        "description_type": attr(d, "descriptionType"),
                        "lang": attr(d, _XML_LANG),
                    }
                )

    def related_identifiers(self, el: _Element, out: _Out) -> None:
        append = out["related_identifiers"].append
        for r in el.iterchildren(self.related_identifier):
            value = text_of(r)
            if value is not None:
                append(
                    {
                        "identifier": value,
                        "identifier_type": attr(r, "relatedIdentifierType"),
                        "relation_type": attr(r, "relationType"),
                        "resource_type_general": attr(r, "resourceTypeGeneral"),
                    }
                )

    def publisher(self, el: _Element, out: _Out) -> None:
        out["publisher"] = text_of(el)

    def publication_year(self, el: _Element, out: _Out) -> None:
        value = text_of(el)
        out["publication_year"] = int(value) if value is not None and value.isdigit() else None

    def language(self, el: _Element, out: _Out) -> None:
        out["language"] = text_of(el)

    def version(self, el: _Element, out: _Out) -> None:
        out["version"] = text_of(el)

    def formats(self, el: _Element, out: _Out) -> None:
        out["formats"].extend(v for f in el.iterchildren(self.format) if (v := text_of(f)))

    def sizes(self, el: _Element, out: _Out) -> None:
        out["sizes"].extend(v for s in el.iterchildren(self.size) if (v := text_of(s)))

    def funding_references(self, el: _Element, out: _Out) -> None:
        fields = self.funding_fields
        for ref in el.iterchildren(self.funding_reference):
            entry: dict[str, str | None] = {
                "funder_name": None,
                "funder_identifier": None,
                "funder_identifier_type": None,
                "award_number": None,
                "award_uri": None,
                "award_title": None,
            }
            for child in ref:
                spec = fields.get(child.tag)
                if spec is None:
                    continue
                key, attr_key, attr_name = spec
                entry[key] = text_of(child)
                if attr_key is not None and attr_name is not None:
                    entry[attr_key] = attr(child, attr_name)
            out["funding_references"].append(entry)


@lru_cache(maxsize=32)
def _schema(ns: str | None) -> _Schema:
    return _Schema(ns)


def find_resource(root: _Element) -> _Element:
    """The DataCite ``<resource>``: the root itself, the one inside an ``oai_datacite``
    wrapper (:func:`oaipmh_dagster.formats.unwrap`), else the first one at any depth of
    another wrapper."""
    found = unwrap(root)
    if isinstance(found.tag, str) and localname(found.tag) == "resource":
        return found
    for found in root.iter("{*}resource"):
        return found
    raise TransformError(
        "unexpected_format",
        f"expected a DataCite <resource> (or an oai_datacite wrapper), got {root.tag!r}",
        element_path(root),
    )


def transform(root: _Element) -> dict[str, Any]:
    """Map a DataCite resource (kernel 2/3/4, optionally wrapped in ``oai_datacite``)."""
    resource = find_resource(root)
    ns = namespace_of(resource.tag)
    handlers = _schema(ns).handlers
    out: dict[str, Any] = {
        "doi": None,
        "identifiers": [],
        "titles": [],
        "title": None,
        "creators": [],
        "contributors": [],
        "publisher": None,
        "publication_year": None,
        "types": {"resource_type_general": None, "resource_type": None},
        "subjects": [],
        "dates": [],
        "language": None,
        "related_identifiers": [],
        "rights": [],
        "descriptions": [],
        "version": None,
        "formats": [],
        "sizes": [],
        "funding_references": [],
        "schema": ns,
    }
    for child in resource:
        handler = handlers.get(child.tag)  # comments and PIs have non-str tags: no handler
        if handler is not None:
            handler(child, out)
    titles = out["titles"]
    if titles:
        out["title"] = next(
            (t["title"] for t in titles if t["title_type"] is None), titles[0]["title"]
        )
    return out
