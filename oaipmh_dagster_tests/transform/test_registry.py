"""Registry, dotted-path plugins, the hardened parser and TransformError."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from lxml import etree

from oaipmh_dagster.transform import (
    TransformError,
    available_transformers,
    datacite,
    element_path,
    get_transformer,
    marc21,
    oai_dc,
    register_transformer,
    transform_element,
    transform_record,
    xml,
)

HERE = __name__  # this module, importable as a plugin
DC = b"""<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"
  xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>A title</dc:title>
  <dc:creator>Someone</dc:creator></oai_dc:dc>"""


# --- plugins used through their dotted paths ------------------------------------------


def title_and_tag(element: etree._Element) -> dict[str, Any]:
    """A plugin: the root's local name and the first title."""
    title = element.findtext("{http://purl.org/dc/elements/1.1/}title")
    return {"root": etree.QName(element).localname, "title": title}


class Plugins:
    @staticmethod
    def upper_title(element: etree._Element) -> dict[str, Any]:
        return {"title": element.findtext("{*}title").upper()}


def explodes(element: etree._Element) -> dict[str, Any]:
    return {"ratio": 1 / 0}


def rejects_creator(element: etree._Element) -> dict[str, Any]:
    creator = element.find("{http://purl.org/dc/elements/1.1/}creator")
    raise TransformError("invalid_record", "creators are not allowed", element_path(creator))


def returns_list(element: etree._Element) -> Any:
    return ["not", "a", "dict"]


def returns_set(element: etree._Element) -> dict[str, Any]:
    return {"ok": [1, "two", None, {"nested": True}], "bad": {"values": {1, 2}}}


NOT_CALLABLE = 42


@pytest.fixture(autouse=True)
def _plugins_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator lists this module (and a package that is not installed, for its
    import error) in $OAIPMH_TRANSFORMER_MODULES, as plugins by path need."""
    monkeypatch.setenv("OAIPMH_TRANSFORMER_MODULES", f"{HERE}, no_such_package")


# --- registry ------------------------------------------------------------------------


def test_available_transformers() -> None:
    assert available_transformers() == ["datacite", "marc21", "marcxml", "mods", "oai_dc",
                                        "oai_openaire", "qdc", "xml"]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("oai_dc", "oai_dc"),
        ("datacite", "datacite"),
        ("oai_datacite", "datacite"),
        ("datacite3", "datacite"),
        ("datacite4", "datacite"),
        ("marc21", "marc21"),
        ("marcxml", "marc21"),
        ("MARC21", "marc21"),
        ("mods", "mods"),
        ("MODS", "mods"),
        ("qdc", "qdc"),
        ("oai_qdc", "qdc"),
        ("oai_openaire", "oai_openaire"),
        ("oai_ead", "xml"),
        ("", "xml"),
    ],
)
def test_default_transformer_for(prefix: str, expected: str) -> None:
    """The registry's prefix -> transformer map (the only one) names built-ins."""
    from oaipmh_dagster.storage.registry import default_transformer

    assert default_transformer(prefix) == expected
    assert get_transformer(default_transformer(prefix))


def test_builtins_resolve_to_their_modules() -> None:
    assert get_transformer("oai_dc") is oai_dc.transform
    assert get_transformer("datacite") is datacite.transform
    assert get_transformer("marc21") is marc21.transform
    assert get_transformer("marcxml") is marc21.transform
    assert get_transformer("xml") is xml.transform


def test_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(TransformError) as info:
        get_transformer("dublin_core")
    error = info.value
    assert isinstance(error, ValueError)  # validators that catch ValueError see it
    assert error.type == "unknown_transformer"
    assert error.location == "dublin_core"
    for name in ("oai_dc", "datacite", "marc21", "xml", "package.module:function"):
        assert name in error.message


def test_plugin_by_dotted_path() -> None:
    fn = get_transformer(f"{HERE}:title_and_tag")
    assert fn is title_and_tag
    assert transform_record(f"{HERE}:title_and_tag", DC) == {"root": "dc", "title": "A title"}
    assert transform_record(f"{HERE}:Plugins.upper_title", DC) == {"title": "A TITLE"}


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("no_such_package.module:fn", "cannot import module 'no_such_package.module'"),
        (f"{HERE}:missing", f"module '{HERE}' has no attribute 'missing'"),
        (f"{HERE}:Plugins.missing", "has no attribute 'Plugins.missing'"),
        (f"{HERE}:NOT_CALLABLE", "is not callable"),
        (f"{HERE}:", "malformed plugin path"),
        ("a b:c", "malformed plugin path"),
        (":fn", "malformed plugin path"),
        ("pkg.mod:fn:extra", "malformed plugin path"),
    ],
)
def test_bad_plugin_paths(path: str, fragment: str) -> None:
    with pytest.raises(TransformError) as info:
        get_transformer(path)
    assert info.value.type == "bad_plugin"
    assert fragment in info.value.message
    assert info.value.location == path


def test_register_transformer() -> None:
    register_transformer("test_only_titles", title_and_tag)
    try:
        assert "test_only_titles" in available_transformers()
        assert transform_record("test_only_titles", DC)["title"] == "A title"
        with pytest.raises(ValueError, match="already registered"):
            register_transformer("test_only_titles", title_and_tag)
        with pytest.raises(ValueError, match="must match"):
            register_transformer("Bad Name", title_and_tag)
    finally:
        from oaipmh_dagster import transform

        transform._registry.pop("test_only_titles", None)


# --- failures ------------------------------------------------------------------------


def test_transformer_that_raises() -> None:
    path = f"{HERE}:explodes"
    with pytest.raises(TransformError) as info:
        transform_record(path, DC)
    assert info.value.to_dict() == {
        "type": "transform_failed",
        "message": "ZeroDivisionError: division by zero",
        "location": path,
    }
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_transformer_error_keeps_its_element_location() -> None:
    with pytest.raises(TransformError) as info:
        transform_record(f"{HERE}:rejects_creator", DC)
    assert info.value.to_dict() == {
        "type": "invalid_record",
        "message": "creators are not allowed",
        "location": "/oai_dc:dc/dc:creator",
    }


def test_callable_passed_directly() -> None:
    assert transform_record(title_and_tag, DC)["title"] == "A title"
    with pytest.raises(TransformError) as info:
        transform_record(explodes, DC)
    assert info.value.location == f"{HERE}:explodes"


def returns_a_cycle(el: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"title": ["t"]}
    out["self"] = [out]
    return out


def test_a_plugin_output_with_a_cycle_is_a_bad_output() -> None:
    """The store encodes transformed metadata without a cycle check: the output check
    must refuse a cycle as bad output (not overflow the stack)."""
    with pytest.raises(TransformError) as info:
        transform_record(f"{HERE}:returns_a_cycle", DC)
    assert info.value.type == "bad_output"
    assert "$.self[0]" in info.value.message


def returns_deep_nesting(el: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"leaf": 1}
    for _ in range(5000):
        out = {"down": out}
    return out


def test_a_plugin_output_nested_too_deep_is_a_bad_output() -> None:
    with pytest.raises(TransformError) as info:
        transform_record(f"{HERE}:returns_deep_nesting", DC)
    assert info.value.type == "bad_output"
    assert "deeper than 200" in info.value.message


@pytest.mark.parametrize(
    ("fn", "fragment"),
    [("returns_list", "returned list, not a dict"), ("returns_set", "$.bad.values")],
)
def test_plugin_output_must_be_json_ready(fn: str, fragment: str) -> None:
    with pytest.raises(TransformError) as info:
        transform_record(f"{HERE}:{fn}", DC)
    assert info.value.type == "bad_output"
    assert fragment in info.value.message


@pytest.mark.parametrize(
    "broken",
    [b"", b"<a>", b"<a></b>", b"not xml at all", b"<a>\x00</a>", "<a>\u00e9</b>"],
)
def test_broken_xml(broken: bytes | str) -> None:
    with pytest.raises(TransformError) as info:
        transform_record("xml", broken)
    assert info.value.type == "xml_syntax"
    assert info.value.message


def test_broken_xml_location_is_line_and_column() -> None:
    with pytest.raises(TransformError) as info:
        transform_record("oai_dc", b"<dc>\n  <title>x</titel>\n</dc>")
    assert info.value.location == "line 2, column 19"
    assert info.value.message.startswith("Opening and ending tag mismatch: title")
    assert "column" not in info.value.message


def test_unknown_transformer_fails_before_parsing() -> None:
    with pytest.raises(TransformError) as info:
        transform_record("nope", b"<<< broken")
    assert info.value.type == "unknown_transformer"


def test_external_entities_and_dtds_are_not_loaded(tmp_path: Any) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    xml = (
        f'<!DOCTYPE dc [<!ENTITY s SYSTEM "{secret.as_uri()}"><!ENTITY i "internal">]>'
        '<dc xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>&s;</dc:title>'
        "<dc:subject>&i;</dc:subject></dc>"
    ).encode()
    assert "TOP SECRET" not in repr(transform_record("xml", xml))
    assert "TOP SECRET" not in repr(transform_record("oai_dc", xml))


def test_entity_expansion_bomb_is_not_expanded() -> None:
    bomb = (
        b'<!DOCTYPE r [<!ENTITY a "aaaaaaaaaa">'
        + b"".join(
            b'<!ENTITY %c "%s">' % (chr(ord("b") + i).encode(), (b"&%c;" % (ord("a") + i)) * 10)
            for i in range(8)
        )
        + b"]><r>&i;</r>"  # &i; would expand to 10**9 characters
    )
    # libxml2 either refuses the document (amplification limit) or keeps the reference.
    try:
        result = transform_record("xml", bomb)
    except TransformError as error:
        assert error.type == "xml_syntax"
    else:
        assert len(repr(result)) < 200


def test_transform_error_pickles_and_prints() -> None:
    error = TransformError("xml_syntax", "bad", "line 1, column 2")
    clone = pickle.loads(pickle.dumps(error))
    assert clone.to_dict() == error.to_dict()
    assert str(error) == "xml_syntax: bad (at line 1, column 2)"


def test_transform_element_inside_a_page(sickle_dc: dict[str, bytes]) -> None:
    """A harvester can transform the metadata element of a parsed page without copying it."""
    page = etree.fromstring(
        b'<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><GetRecord><record>'
        b"<metadata>" + DC + b"</metadata></record></GetRecord></OAI-PMH>"
    )
    metadata = page.find(".//{http://www.openarchives.org/OAI/2.0/}metadata")
    assert transform_element("oai_dc", metadata[0]) == transform_record("oai_dc", DC)
