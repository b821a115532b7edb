"""xslt:PATH transformers: crosswalks on real records, parameters, refusals, security,
failing records, reloading, content identity and threads."""

from __future__ import annotations

import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from lxml import etree

from oaipmh_dagster.transform import (
    TransformError,
    get_transformer,
    transform_element,
    transform_record,
    transformer_identity,
    xslt,
)
from oaipmh_dagster.transform import marc21 as marc21_mod
from oaipmh_dagster.transform import mods as mods_mod
from oaipmh_dagster.transform import oai_dc as oai_dc_mod

from .conftest import OAI_FIXTURES, Records

XSL = Path(__file__).with_name("xsl")
REALWORLD = OAI_FIXTURES.parent / "oai-realworld" / "files"
OAI = "{http://www.openarchives.org/OAI/2.0/}"
XSL_HEAD = ('<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform" '
            'xmlns:exsl="http://exslt.org/common" extension-element-prefixes="exsl">\n')
DC_RECORD = (b'<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
             b'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title> A  title </dc:title>'
             b'<dc:creator>Doe, J.</dc:creator></oai_dc:dc>')


def _stylesheet(tmp_path: Path, body: str, name: str = "s.xsl", head: str = XSL_HEAD) -> Path:
    path = tmp_path / name
    path.write_text(f"{head}{body}\n</xsl:stylesheet>\n", encoding="utf-8")
    return path


def _crosswalked(spec: str, raw: bytes) -> etree._Element:
    """The stylesheet's result element itself (lxml in this process)."""
    path, params = xslt.parse_spec(spec)
    sheet = etree.XSLT(etree.parse(path))
    return sheet(etree.fromstring(raw), **{k: etree.XSLT.strparam(v)
                                           for k, v in params.items()}).getroot()


class _Server(http.server.ThreadingHTTPServer):
    hits: list[str]


@pytest.fixture
def loopback() -> Iterator[_Server]:
    """A loopback HTTP server that records every request it receives."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook
            assert isinstance(self.server, _Server)
            self.server.hits.append(self.path)
            body = (f'{XSL_HEAD}<xsl:template match="/"><pwned/></xsl:template>'
                    "</xsl:stylesheet>").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = _Server(("127.0.0.1", 0), Handler)
    srv.hits = []
    srv.timeout = 5
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def _url(srv: _Server, name: str = "evil.xsl") -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/{name}"


# -- crosswalks on real records ---------------------------------------------------------


def test_oai_dc_to_mods_on_real_records(sickle_dc: Records, pyoai_dc: Records) -> None:
    spec = f"xslt:{XSL / 'oai_dc_to_mods.xsl'}?source=Library%20of%20%22Test%22%26Co"
    records = {**sickle_dc, **pyoai_dc}
    assert len(records) >= 90
    for identifier, raw in records.items():
        out = transform_record(spec, raw)  # a MODS result: read by the mods transformer
        assert out == mods_mod.transform(_crosswalked(spec, raw)), identifier
        dc = oai_dc_mod.transform(etree.fromstring(raw))
        titles = [t["title"] for t in out["titles"]]
        assert titles == [" ".join(t.split()) for t in dc["title"]], identifier
        names = [n["name"] for n in out["names"]]
        assert names == [" ".join(c.split()) for c in dc["creator"]], identifier
        assert out["creators"] == names, identifier  # role "creator"
        kinds = [i["type"] for i in out["identifiers"]]
        assert len(kinds) == len(dc["identifier"]) and set(kinds) <= {"uri", "local"}
        assert out["record_source"] == 'Library of "Test"&Co'  # the decoded parameter


def _marc_records() -> list[tuple[str, etree._Element]]:
    if not REALWORLD.is_dir():
        pytest.skip(f"real-world OAI-PMH responses not found at {REALWORLD}")
    out = []
    for name in ("alma-lr-marc21.xml", "cds-lr-hepex.xml", "cds-lr-hepth.xml", "nusl-gr-marc.xml"):
        page = etree.parse(str(REALWORLD / name)).getroot()
        for record in page.iter(f"{OAI}record"):
            metadata = record.find(f"{OAI}metadata")
            if metadata is not None and len(metadata):
                out.append((f"{name}: {record.findtext(f'{OAI}header/{OAI}identifier')}",
                            metadata[0]))
    return out


def _norm(text: str) -> str:
    """The crosswalk normalizes space (the built-in transformer keeps inner runs)."""
    return " ".join(text.split())


def test_marc21_to_dc_on_real_records() -> None:
    records = _marc_records()
    assert len(records) > 100
    fn = get_transformer(f"xslt:{XSL / 'marc21_to_dc.xsl'}")
    with_subjects = with_identifiers = 0
    for label, element in records:
        dc = transform_element(fn, element)  # the element inside its page, as harvested
        assert list(dc) == list(oai_dc_mod.DC_ELEMENTS), label  # read as oai_dc
        marc = marc21_mod.transform(element)
        assert dc["title"] == ([_norm(marc["title"])] if marc["title"] else []), label
        if marc["author"]:
            assert dc["creator"][0] == _norm(marc["author"]), label
        subfields = [(f["tag"], sub["code"]) for f in marc["data_fields"]
                     for sub in f["subfields"]]
        assert len(dc["creator"]) == sum(
            tag in ("100", "110", "700", "710") and code == "a" for tag, code in subfields)
        assert len(dc["subject"]) == sum(tag[0] == "6" and code == "a"
                                         for tag, code in subfields), label
        assert len(dc["identifier"]) == sum(
            (tag in ("020", "022", "024") and code == "a") or (tag == "856" and code == "u")
            for tag, code in subfields), label
        assert all(len(code) == 3 for code in dc["language"]), label
        with_subjects += bool(dc["subject"])
        with_identifiers += bool(dc["identifier"])
    assert with_subjects > 50 and with_identifiers > 5


# -- parameters and names ----------------------------------------------------------------


@pytest.mark.parametrize(("spec", "path", "params"), [
    ("xslt:/a/b.xsl", "/a/b.xsl", {}),
    ("xslt:/a/b.xsl?x=1&y=two%20words", "/a/b.xsl", {"x": "1", "y": "two words"}),
    ("xslt:rel.xsl?empty=&plus=a+b&q=%3F%26%3D", "rel.xsl", {"empty": "", "plus": "a+b",
                                                             "q": "?&="}),
])
def test_parse_spec(spec: str, path: str, params: dict[str, str]) -> None:
    assert xslt.parse_spec(spec) == (path, params)


@pytest.mark.parametrize(("spec", "needle"), [
    ("xslt:", "names no stylesheet"),
    ("xslt:?a=1", "names no stylesheet"),
    ("xslt:/a.xsl?novalue", "bad stylesheet parameter"),
    ("xslt:/a.xsl?1x=2", "bad stylesheet parameter"),
    ("xslt:/a.xsl?a=1&a=2", "given twice"),
])
def test_bad_spec(spec: str, needle: str) -> None:
    with pytest.raises(TransformError, match=needle) as info:
        get_transformer(spec)
    assert info.value.type == "bad_stylesheet"


def test_normalize_makes_the_path_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert xslt.normalize("xslt:sub/c.xsl?a=%20") == f"xslt:{tmp_path}/sub/c.xsl?a=%20"
    assert xslt.normalize(" xslt:/abs.xsl ") == "xslt:/abs.xsl"


def test_string_params_cannot_inject_xpath(tmp_path: Path) -> None:
    path = _stylesheet(tmp_path, '<xsl:param name="p"/><xsl:template match="/">'
                       '<out><xsl:value-of select="$p"/></out></xsl:template>')
    out = transform_record(f"xslt:{path}?p=%27)%20or%20(%221", DC_RECORD)
    assert out == {"out": ["') or (\"1"]}


# -- refused at load ---------------------------------------------------------------------


def test_missing_and_directory_stylesheets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TransformError, match=r"stylesheet .*nope\.xsl does not exist"):
        get_transformer(f"xslt:{tmp_path / 'nope.xsl'}")
    with pytest.raises(TransformError, match="is a directory"):
        get_transformer(f"xslt:{tmp_path}")


def test_unreadable_stylesheet_is_refused(tmp_path: Path) -> None:
    locked = _stylesheet(tmp_path, "", "locked.xsl")
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running with privileges that read any file")
        with pytest.raises(TransformError, match="cannot read stylesheet"):
            get_transformer(f"xslt:{locked}")
    finally:
        locked.chmod(0o600)


def test_not_xml_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.xsl"
    path.write_text('<?xml version="1.0"?>\n<xsl:stylesheet version="1.0" '
                    'xmlns:xsl="http://www.w3.org/1999/XSL/Transform">\n<oops>\n'
                    "</xsl:stylesheet>\n")
    with pytest.raises(TransformError) as info:
        get_transformer(f"xslt:{path}")
    err = info.value
    assert err.type == "bad_stylesheet"
    assert str(path) in err.message and "is not XML" in err.message and "line 4" in err.message


def test_compile_error_gives_libxslt_first_error_and_line(tmp_path: Path) -> None:
    path = _stylesheet(tmp_path, '<xsl:template match="/">\n'
                       '<out><xsl:value-of select="concat(("/></out>\n</xsl:template>')
    with pytest.raises(TransformError) as info:
        get_transformer(f"xslt:{path}")
    msg = info.value.message
    assert str(path) in msg and "does not compile" in msg
    assert "could not compile select expression 'concat(('" in msg
    assert msg.endswith("(stylesheet line 3)")


def test_a_document_that_is_not_a_stylesheet_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plain.xml"
    path.write_text("<plain/>")
    with pytest.raises(TransformError, match="does not compile"):
        get_transformer(f"xslt:{path}")


# -- security: no network, no writes -----------------------------------------------------


@pytest.mark.parametrize("kind", ["include", "import"])
def test_remote_include_or_import_is_refused(tmp_path: Path, loopback: _Server,
                                             kind: str) -> None:
    path = _stylesheet(tmp_path, f'<xsl:{kind} href="{_url(loopback)}"/>')
    with pytest.raises(TransformError, match=f"xsl:{kind} of .* is not a local file") as info:
        get_transformer(f"xslt:{path}")
    assert info.value.type == "bad_stylesheet"
    assert loopback.hits == []


def test_remote_url_in_a_local_include_is_refused(tmp_path: Path, loopback: _Server) -> None:
    _stylesheet(tmp_path, f'<xsl:import href="{_url(loopback)}"/>', name="inner.xsl")
    path = _stylesheet(tmp_path, '<xsl:include href="inner.xsl"/>')
    with pytest.raises(TransformError, match="inner.xsl refused"):
        get_transformer(f"xslt:{path}")
    assert loopback.hits == []


def test_libxslt_refuses_the_network_by_itself(tmp_path: Path, loopback: _Server) -> None:
    """The second barrier: lxml compiling a remote include with our parser and access
    control (as if the pre-check missed it) asks nothing either."""
    path = _stylesheet(tmp_path, f'<xsl:include href="{_url(loopback)}"/>')
    doc = etree.fromstring(path.read_bytes(), xslt._parser(), base_url=str(path))
    with pytest.raises(etree.XSLTParseError):
        etree.XSLT(doc, access_control=xslt._ACCESS)
    assert loopback.hits == []


def test_external_entities_in_the_stylesheet_are_not_fetched(tmp_path: Path,
                                                             loopback: _Server) -> None:
    head = (f'<!DOCTYPE xsl:stylesheet [<!ENTITY e SYSTEM "{_url(loopback, "e.xml")}">]>\n'
            + XSL_HEAD)
    path = _stylesheet(tmp_path, '<xsl:template match="/"><out>&e;</out></xsl:template>',
                       head=head)
    try:
        out = transform_record(f"xslt:{path}", DC_RECORD)
        assert "pwned" not in repr(out)
    except TransformError:
        pass  # refusing the stylesheet is as good
    assert loopback.hits == []


def test_remote_document_fails_the_record(tmp_path: Path, loopback: _Server) -> None:
    path = _stylesheet(tmp_path, '<xsl:template match="/"><out><xsl:copy-of '
                       f'select="document(\'{_url(loopback, "doc.xml")}\')"/></out>'
                       "</xsl:template>")
    with pytest.raises(TransformError) as info:
        transform_record(f"xslt:{path}", DC_RECORD)
    assert info.value.type == "transform_failed"
    assert "refused" in info.value.message or "denied" in info.value.message
    assert loopback.hits == []


def test_writing_files_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "out" / "written.xml"
    path = _stylesheet(tmp_path, '<xsl:template match="/"><exsl:document '
                       f'href="{target}"><w/></exsl:document><out/></xsl:template>')
    with pytest.raises(TransformError) as info:
        transform_record(f"xslt:{path}", DC_RECORD)
    assert info.value.type == "transform_failed" and "write" in info.value.message.lower()
    assert not target.exists() and not target.parent.exists()


def test_local_document_and_include_work(tmp_path: Path) -> None:
    (tmp_path / "lookup.xml").write_text('<map><entry key="Doe, J.">ORCID-1</entry></map>')
    _stylesheet(tmp_path, '<xsl:template name="hello"><hello/></xsl:template>', "lib.xsl")
    path = _stylesheet(tmp_path, '<xsl:include href="lib.xsl"/><xsl:template match="/">'
                       '<out><xsl:call-template name="hello"/><xsl:value-of select="document('
                       "'lookup.xml')/map/entry[@key=current()/*/*[2]]\"/></out></xsl:template>")
    out = transform_record(f"xslt:{path}", DC_RECORD)
    assert out == {"out": ["ORCID-1"], "out/hello": []}


# -- records that fail -------------------------------------------------------------------


@pytest.mark.parametrize(("template", "needle"), [
    ('<xsl:message terminate="yes">no title in <xsl:value-of select="name(/*)"/></xsl:message>',
     "no title in oai_dc:dc"),
    ("", "an empty result"),
    ("just text", "text, not XML"),
    ('<out><xsl:value-of select="unknown:f()" xmlns:unknown="urn:x"/></out>', "XSLT failed"),
])
def test_failing_record_raises_transform_failed(tmp_path: Path, template: str,
                                                needle: str) -> None:
    path = _stylesheet(tmp_path, f'<xsl:template match="/">{template}</xsl:template>')
    with pytest.raises(TransformError) as info:
        transform_record(f"xslt:{path}", DC_RECORD)
    err = info.value
    assert err.type == "transform_failed" and needle in err.message
    assert err.location == f"xslt:{path}"


def test_mods_crosswalk_stops_on_other_formats() -> None:
    with pytest.raises(TransformError, match="not an oai_dc record: record"):
        transform_record(f"xslt:{XSL / 'oai_dc_to_mods.xsl'}", b"<record/>")


# -- reloading, identity, threads ----------------------------------------------------------


def _title_sheet(path: Path, word: str) -> None:
    path.write_text(f'{XSL_HEAD}<xsl:template match="/"><{word}/></xsl:template>'
                    "</xsl:stylesheet>")


def test_edit_recompiles_and_changes_identity(tmp_path: Path) -> None:
    path = tmp_path / "s.xsl"
    _title_sheet(path, "first")
    spec = f"xslt:{path}"
    assert transform_record(spec, DC_RECORD) == {"first": []}
    before = transformer_identity(spec)
    assert before.startswith(spec) and before != spec
    assert transformer_identity(spec) == before  # stable while the file is
    _title_sheet(path, "second")
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse clocks
    assert transform_record(spec, DC_RECORD) == {"second": []}
    after = transformer_identity(spec)
    assert after != before
    assert transformer_identity(spec + "?x=1") != after  # parameters count too
    # Same bytes, new mtime: same identity (the digest is of the content).
    os.utime(path, ns=(2, 2))
    assert transformer_identity(spec) == after


def test_edit_of_an_included_file_changes_identity(tmp_path: Path) -> None:
    inner = tmp_path / "inner.xsl"
    _title_sheet(inner, "one")
    path = _stylesheet(tmp_path, '<xsl:include href="inner.xsl"/>')
    spec = f"xslt:{path}"
    before = transformer_identity(spec)
    _title_sheet(inner, "two")
    os.utime(inner, ns=(1, 1))
    assert transformer_identity(spec) != before
    assert transform_record(spec, DC_RECORD) == {"two": []}


def test_identity_of_a_vanished_stylesheet_and_of_other_names(tmp_path: Path) -> None:
    path = tmp_path / "s.xsl"
    _title_sheet(path, "x")
    spec = f"xslt:{path}"
    transformer_identity(spec)
    path.unlink()
    assert transformer_identity(spec) == f"{spec}\x1funavailable"
    assert transformer_identity("oai_dc") == "oai_dc"


def test_one_compiled_stylesheet_per_thread(sickle_dc: Records) -> None:
    fn = get_transformer(f"xslt:{XSL / 'oai_dc_to_mods.xsl'}?source=t")
    assert fn is get_transformer(f"xslt:{XSL / 'oai_dc_to_mods.xsl'}?source=t")  # cached
    raws = list(sickle_dc.values()) * 20
    expected = [transform_record(fn, raw) for raw in raws]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda raw: transform_record(fn, raw), raws))
    assert got == expected
    assert isinstance(fn, xslt.XsltTransformer)


def test_copy_of_the_shipped_crosswalk_runs_from_another_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("marc21_to_dc.xsl", "marc_common.xsl"):
        shutil.copy(XSL / name, tmp_path / name)
    monkeypatch.chdir("/")  # the import is resolved against the stylesheet, not the cwd
    out = transform_record(f"xslt:{tmp_path / 'marc21_to_dc.xsl'}",
                           b'<record xmlns="http://www.loc.gov/MARC21/slim"><datafield '
                           b'tag="245" ind1="1" ind2="0"><subfield code="a">T /</subfield>'
                           b"</datafield></record>")
    assert out["title"] == ["T"]  # an oai_dc result
