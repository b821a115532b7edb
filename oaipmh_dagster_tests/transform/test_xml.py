"""The lossless mapping earlier versions of the generic ``xml`` transformer stored (rows
of that shape are read as element paths): ``dict_to_xml`` rebuilds equivalent XML."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from oaipmh_dagster.transform import parse_metadata, transform_record
from oaipmh_dagster.transform.xml import dict_to_xml, lossless, readable


def transform_lossless(xml: bytes) -> dict[str, Any]:
    return lossless(parse_metadata(xml))


def _is_blank(value: str | None) -> bool:
    return not value or value.isspace()


def canonical(el: etree._Element) -> Any:
    """A comparable form of a tree, independent of prefixes.

    Whitespace-only text between the children of element-only content (indentation)
    is ignorable; everything else must survive, verbatim.
    """
    if el.tag is etree.Comment:
        return ("comment", el.text or "")
    if el.tag is etree.ProcessingInstruction:
        return ("pi", el.target, el.text)
    if el.tag is etree.Entity:
        return ("entity", el.name)
    children = list(el)
    texts = [el.text] + [c.tail for c in children]
    element_only = bool(children) and all(_is_blank(t) for t in texts)
    if element_only:
        texts = [None] * len(texts)
    texts = [t or None for t in texts]
    return (
        el.tag,
        sorted(el.attrib.items()),
        texts[0],
        [(canonical(c), t) for c, t in zip(children, texts[1:], strict=True)],
    )


def assert_round_trip(xml: bytes, *, fixed_point: bool = True) -> dict[str, Any]:
    mapped = transform_lossless(xml)
    assert json.loads(json.dumps(mapped)) == mapped, "output is JSON-ready"
    rebuilt = dict_to_xml(mapped)
    original = etree.fromstring(xml, etree.XMLParser(resolve_entities=False))
    assert canonical(rebuilt) == canonical(original)
    if fixed_point:  # mapping the rebuilt tree gives the same dict
        assert transform_lossless(etree.tostring(rebuilt, encoding="UTF-8")) == mapped
    return mapped


# --- generated trees ----------------------------------------------------------------

NAMESPACES = [None, "urn:example:a", "http://example.org/b/"]
PREFIXES = {"urn:example:a": "a", "http://example.org/b/": "b"}

_chars = st.characters(
    blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufffe\uffff"
) | st.sampled_from("\t\n\r  <>&'\"")
texts = st.none() | st.text(_chars, max_size=12)
_name_start = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwyzé_"  # no "x": no "xml..."
names = st.builds(
    str.__add__, st.sampled_from(_name_start), st.text(_name_start + "x0123456789.-", max_size=6)
)
qnames = st.builds(lambda ns, n: f"{{{ns}}}{n}" if ns else n, st.sampled_from(NAMESPACES), names)
attributes = st.dictionaries(qnames, st.text(_chars, max_size=8), max_size=3)
comments = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=8).filter(
    lambda t: "--" not in t and not t.endswith("-")
)

Spec = tuple[str, Any, Any, Any, Any]  # (kind, tag or text, attributes, text, children)


def _trees(children: st.SearchStrategy[list[Spec]]) -> st.SearchStrategy[Spec]:
    return st.tuples(st.just("element"), qnames, attributes, texts, children)


nodes = st.recursive(
    st.tuples(st.just("element"), qnames, attributes, texts, st.just([]))
    | st.tuples(st.just("comment"), comments, st.none(), st.none(), st.none())
    | st.tuples(st.just("pi"), names, st.none(), texts, st.none()),
    lambda inner: _trees(st.lists(st.tuples(inner, texts), max_size=4)),
    max_leaves=12,
)
roots = _trees(st.lists(st.tuples(nodes, texts), max_size=5))


def _build(spec: Spec, parent: etree._Element | None = None) -> etree._Element:
    kind, name, attrib, text, children = spec
    if kind == "comment":
        node = etree.Comment(name)
    elif kind == "pi":
        node = etree.ProcessingInstruction(name, text or None)
    elif parent is None:
        nsmap = {prefix: uri for uri, prefix in PREFIXES.items()}
        node = etree.Element(name, attrib, nsmap=nsmap)
    else:
        node = etree.Element(name, attrib)
    if kind == "element":
        node.text = text
        for child_spec, tail in children or ():
            child = _build(child_spec, node)
            node.append(child)
            child.tail = tail
    return node


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(roots)
def test_generated_trees_round_trip(spec: Spec) -> None:
    root = _build(spec)
    assert_round_trip(etree.tostring(root, encoding="UTF-8"))


def _squeezed(paths: dict[str, list[str]]) -> dict[str, list[str]]:
    return {key: ["".join(text.split()) for text in texts] for key, texts in paths.items()}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(roots)
def test_old_rows_read_as_the_element_paths_of_the_same_record(spec: Spec) -> None:
    raw = etree.tostring(_build(spec), encoding="UTF-8")
    paths = transform_record("xml", raw)
    # The old shape dropped whitespace-only text nodes (`<a><b>0</b> </a>`: the tail " "),
    # so the texts agree but for that whitespace.
    assert _squeezed(readable(transform_lossless(raw))) == _squeezed(paths)
    root = etree.QName(parse_metadata(raw)).localname
    assert all(key == root or key.startswith(f"{root}/") for key in paths)
    assert all(isinstance(v, list) and all(isinstance(t, str) and t == t.strip() and t
                                           for t in v) for v in paths.values())


# --- hand-picked cases ---------------------------------------------------------------


def test_shape_of_a_small_record() -> None:
    xml = (
        b'<r:rec xmlns:r="urn:r" xmlns="urn:d" id="7" xml:lang="en">\n'
        b"  <title>T</title>\n"
        b"  <p>Mixed <b>bold</b> text<!-- c --><?pi data?></p>\n"
        b"  <empty/>\n"
        b"</r:rec>"
    )
    mapped = assert_round_trip(xml)
    assert mapped == {
        "tag": "{urn:r}rec",
        "attributes": {"id": "7", "{http://www.w3.org/XML/1998/namespace}lang": "en"},
        "children": [
            {"tag": "{urn:d}title", "text": "T"},
            {
                "tag": "{urn:d}p",
                "text": "Mixed ",
                "children": [
                    {"tag": "{urn:d}b", "text": "bold"},
                    " text",
                    {"comment": " c "},
                    {"pi": "pi", "text": "data"},
                ],
            },
            {"tag": "{urn:d}empty"},
        ],
        "nsmap": {"r": "urn:r", "": "urn:d"},
    }
    # The prefixes come back too.
    assert etree.tostring(dict_to_xml(mapped)).startswith(b'<r:rec xmlns:r="urn:r" xmlns="urn:d"')


def test_whitespace_in_mixed_content_is_kept() -> None:
    mapped = assert_round_trip(b"<a><b>x</b> <c>y</c> tail</a>")
    assert mapped["children"] == [
        {"tag": "b", "text": "x"},
        " ",
        {"tag": "c", "text": "y"},
        " tail",
    ]
    assert transform_lossless(b"<a>  </a>") == {"tag": "a", "text": "  ", "nsmap": {}}


def test_unresolved_entities_stay_references() -> None:
    xml = (
        b'<!DOCTYPE a [<!ENTITY secret SYSTEM "file:///etc/hostname">]><a>before &secret; after</a>'
    )
    # No fixed point: without its DOCTYPE the rebuilt tree names an undeclared entity.
    mapped = assert_round_trip(xml, fixed_point=False)
    assert mapped["text"] == "before "
    assert mapped["children"] == [{"entity": "secret"}, " after"]


# --- real records ----------------------------------------------------------------------


def test_real_records_round_trip(
    sickle_dc: dict[str, bytes],
    pyoai_dc: dict[str, bytes],
    zenodo: dict[str, dict[str, bytes]],
) -> None:
    records = [
        *sickle_dc.values(),
        *pyoai_dc.values(),
        *zenodo["oai_dc"].values(),
        *zenodo["datacite"].values(),
    ]
    assert len(records) > 300
    for xml in records:
        assert_round_trip(xml)


def test_real_datacite_record_shape(zenodo: dict[str, dict[str, bytes]]) -> None:
    mapped = transform_lossless(zenodo["datacite"]["oai:zenodo.org:10357859"])
    k4 = "{http://datacite.org/schema/kernel-4}"
    assert mapped["tag"] == f"{k4}resource"
    assert mapped["nsmap"] == {
        "": "http://datacite.org/schema/kernel-4",
        "xsi": "http://www.w3.org/2001/XMLSchema-instance",
    }
    by_tag = {child["tag"]: child for child in mapped["children"]}
    assert by_tag[f"{k4}publisher"] == {"tag": f"{k4}publisher", "text": "Zenodo"}
    assert by_tag[f"{k4}identifier"] == {
        "tag": f"{k4}identifier",
        "attributes": {"identifierType": "DOI"},
        "text": "10.5281/zenodo.10357859",
    }
