"""The six verbs, each response valid against the shipped OAI-PMH 2.0 schema."""

from __future__ import annotations

import pytest
from lxml import etree

from oaipmh_dagster.serve.settings import BadSetting, Settings
from oaipmh_dagster.storage.registry import Registry
from oaipmh_dagster_tests.serve.conftest import OAI, Hub, identifiers, make_hub

DC_NS = "{http://purl.org/dc/elements/1.1/}"


def test_identify_says_what_the_configuration_says(hub: Hub) -> None:
    configured = make_hub(hub.engine, hub.schema, repository_name="Our hub",
                          admin_email="a@example.org, b@example.net",
                          base_url="https://oai.example.org/hub/oai")
    root = configured.get(verb="Identify")
    ident = root.find(f"{OAI}Identify")
    assert ident is not None
    assert ident.findtext(f"{OAI}repositoryName") == "Our hub"
    assert ident.findtext(f"{OAI}baseURL") == "https://oai.example.org/hub/oai"
    assert root.findtext(f"{OAI}request") == "https://oai.example.org/hub/oai"
    assert [e.text for e in ident.iterfind(f"{OAI}adminEmail")] == ["a@example.org",
                                                                     "b@example.net"]
    assert ident.findtext(f"{OAI}earliestDatestamp") == "2024-05-01T12:00:00Z"
    assert ident.findtext(f"{OAI}deletedRecord") == "persistent"
    assert ident.findtext(f"{OAI}granularity") == "YYYY-MM-DDThh:mm:ssZ"


def test_identify_without_a_base_url_names_the_url_asked(hub: Hub) -> None:
    assert hub.get(verb="Identify").findtext(f"{OAI}Identify/{OAI}baseURL") == (
        "http://testserver/oai")


@pytest.mark.parametrize("settings", [
    {"admin_email": "nobody"}, {"hub_name": "a:b"}, {"base_url": "ftp://x/oai"},
    {"page_size": 0}, {"repository_name": " "}])
def test_bad_settings_are_refused(settings: dict) -> None:
    with pytest.raises(BadSetting):
        Settings(**settings)


def test_settings_from_the_environment() -> None:
    s = Settings.from_env({"OAIPMH_SERVE_HUB_NAME": "hub.example.org",
                           "OAIPMH_SERVE_PAGE_SIZE": "50"})
    assert (s.hub_name, s.page_size) == ("hub.example.org", 50)
    with pytest.raises(BadSetting, match="PAGE_SIZE"):
        Settings.from_env({"OAIPMH_SERVE_PAGE_SIZE": "many"})


def test_list_sets_has_each_harvester_and_its_source_sets(hub: Hub) -> None:
    pages = hub.pages("ListSets")
    specs = [(s.findtext(f"{OAI}setSpec"), s.findtext(f"{OAI}setName"))
             for p in pages for s in p.iterfind(f".//{OAI}set")]
    assert specs == [("h1", "First"), ("h1:physics", "First: physics"), ("h2", "h2"),
                     ("m1", "m1")]
    assert len(pages) == 1


def test_list_sets_pages_with_a_token(hub: Hub) -> None:
    small = make_hub(hub.engine, hub.schema, page_size=3)
    pages = small.pages("ListSets")
    assert len(pages) == 2
    last = pages[-1].find(f"{OAI}ListSets/{OAI}resumptionToken")
    assert last is not None and not last.text
    assert (last.get("cursor"), last.get("completeListSize")) == ("3", "4")


def test_no_harvesters_no_set_hierarchy(hub: Hub) -> None:
    registry = Registry(hub.engine)
    for h in registry.list():
        registry.remove(h.id)
    assert hub.error(verb="ListSets") == "noSetHierarchy"
    assert hub.error(verb="ListMetadataFormats") == "noMetadataFormats"


def test_list_metadata_formats_of_the_hub_and_of_an_item(hub: Hub) -> None:
    root = hub.get(verb="ListMetadataFormats")
    formats = {f.findtext(f"{OAI}metadataPrefix"): (f.findtext(f"{OAI}metadataNamespace"),
                                                    f.findtext(f"{OAI}schema"))
               for f in root.iterfind(f".//{OAI}metadataFormat")}
    assert formats == {
        "oai_dc": ("http://www.openarchives.org/OAI/2.0/oai_dc/",
                   "http://www.openarchives.org/OAI/2.0/oai_dc.xsd"),
        "marc21": ("http://www.loc.gov/MARC21/slim",
                   "http://www.loc.gov/standards/marcxml/schema/MARC21slim.xsd")}
    item = hub.get(verb="ListMetadataFormats", identifier="oai:hub:h2:oai:src:r3")
    assert [f.findtext(f"{OAI}metadataPrefix")
            for f in item.iterfind(f".//{OAI}metadataFormat")] == ["oai_dc"]
    assert hub.error(verb="ListMetadataFormats",
                     identifier="oai:hub:h1:nothing") == "idDoesNotExist"


def test_get_record_round_trips_identifiers_that_two_harvesters_share(hub: Hub) -> None:
    titles = {}
    for harvester in ("h1", "h2"):
        identifier = f"oai:hub:{harvester}:oai:src:r5"
        record = hub.get(verb="GetRecord", identifier=identifier, metadataPrefix="oai_dc")
        assert record.findtext(f".//{OAI}header/{OAI}identifier") == identifier
        titles[harvester] = record.findtext(f".//{DC_NS}title")
    assert titles == {"h1": "h1 r5", "h2": "h2 r5"}


def test_get_record_headers(hub: Hub) -> None:
    root = hub.get(verb="GetRecord", identifier="oai:hub:h1:oai:src:r1",
                   metadataPrefix="oai_dc")
    header = root.find(f".//{OAI}header")
    assert header is not None
    assert header.findtext(f"{OAI}datestamp") == "2024-05-01T12:00:01Z"
    assert [s.text for s in header.iterfind(f"{OAI}setSpec")] == ["h1", "h1:physics"]
    # The stored metadata element, as harvested.
    meta = root.find(f".//{OAI}metadata")
    assert meta is not None and len(meta) == 1
    assert etree.QName(meta[0]).localname == "dc"


def test_a_deleted_record_is_a_deleted_header(hub: Hub) -> None:
    root = hub.get(verb="GetRecord", identifier="oai:hub:h2:oai:src:r3",
                   metadataPrefix="oai_dc")
    header = root.find(f".//{OAI}header")
    assert header is not None and header.get("status") == "deleted"
    assert root.find(f".//{OAI}metadata") is None
    listed = hub.pages("ListIdentifiers", metadataPrefix="oai_dc", set="h2")
    deleted = [h.findtext(f"{OAI}identifier") for p in listed
               for h in p.iterfind(f".//{OAI}header") if h.get("status") == "deleted"]
    assert deleted == ["oai:hub:h2:oai:src:r3"]


def test_list_records_in_change_order_with_all_headers(hub: Hub) -> None:
    pages = hub.pages("ListRecords", metadataPrefix="oai_dc")
    ids = identifiers(pages)
    assert ids == ([f"oai:hub:h1:oai:src:r{i}" for i in range(10)]
                   + [f"oai:hub:h2:oai:src:r{i}" for i in range(10)])
    assert len(pages) == 5  # 4 per page
    first = pages[0].find(f"{OAI}ListRecords/{OAI}resumptionToken")
    assert first is not None and (first.get("cursor"), first.get("completeListSize")) == (
        "0", "20")
    records = [r for p in pages for r in p.iterfind(f".//{OAI}record")]
    assert sum(r.find(f"{OAI}metadata") is None for r in records) == 1  # h2's r3


@pytest.mark.parametrize(("params", "expected"), [
    ({"set": "h1:physics"}, [f"oai:hub:h1:oai:src:r{i}" for i in (1, 3, 5, 7, 9)]),
    ({"set": "h2", "from": "2024-05-01T12:00:17Z"},
     [f"oai:hub:h2:oai:src:r{i}" for i in (7, 8, 9)]),
    ({"until": "2024-05-01T12:00:01Z"}, ["oai:hub:h1:oai:src:r0", "oai:hub:h1:oai:src:r1"]),
    ({"from": "2024-05-01", "until": "2024-05-01", "set": "h1"},
     [f"oai:hub:h1:oai:src:r{i}" for i in range(10)]),
])
def test_selective_lists(hub: Hub, params: dict[str, str], expected: list[str]) -> None:
    for verb in ("ListIdentifiers", "ListRecords"):
        assert identifiers(hub.pages(verb, metadataPrefix="oai_dc", **params)) == expected


@pytest.mark.parametrize(("params", "code"), [
    ({}, "badVerb"),
    ({"verb": "Delete"}, "badVerb"),
    ({"verb": "Identify", "set": "x"}, "badArgument"),
    ({"verb": "ListRecords"}, "badArgument"),
    ({"verb": "GetRecord", "identifier": "oai:hub:h1:oai:src:r1"}, "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2024-05-01T12:00Z"},
     "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2024-13-01"},
     "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2024-05-01",
      "until": "2024-05-02T00:00:00Z"}, "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2024-05-02",
      "until": "2024-05-01"}, "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "set": "bad set"}, "badArgument"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "resumptionToken": "x"},
     "badArgument"),
    ({"verb": "ListRecords", "resumptionToken": "x"}, "badResumptionToken"),
    ({"verb": "ListSets", "resumptionToken": "e30.AAAA"}, "badResumptionToken"),
    ({"verb": "ListRecords", "metadataPrefix": "mods"}, "cannotDisseminateFormat"),
    ({"verb": "ListIdentifiers", "metadataPrefix": "marc21"}, "noRecordsMatch"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "set": "nope"}, "noRecordsMatch"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2030-01-01"},
     "noRecordsMatch"),
    ({"verb": "ListRecords", "metadataPrefix": "oai_dc", "until": "2000-01-01"},
     "noRecordsMatch"),
    ({"verb": "GetRecord", "identifier": "oai:hub:h1:oai:src:r1", "metadataPrefix": "marc21"},
     "cannotDisseminateFormat"),
    ({"verb": "GetRecord", "identifier": "oai:other:h1:oai:src:r1",
      "metadataPrefix": "oai_dc"}, "idDoesNotExist"),
    ({"verb": "GetRecord", "identifier": "oai:hub:zz:oai:src:r1", "metadataPrefix": "oai_dc"},
     "idDoesNotExist"),
    ({"verb": "GetRecord", "identifier": "oai:hub:h1:\x01", "metadataPrefix": "oai_dc"},
     "idDoesNotExist"),
])
def test_errors(hub: Hub, params: dict[str, str], code: str) -> None:
    assert hub.error(**params) == code


def test_bad_verb_and_bad_argument_echo_no_arguments(hub: Hub) -> None:
    root = hub.get(verb="ListRecords", metadataPrefix="oai_dc", until="yesterday")
    request = root.find(f"{OAI}request")
    assert request is not None and dict(request.attrib) == {}


def test_repeated_arguments_are_bad(hub: Hub) -> None:
    response = hub.client.get("/oai?verb=Identify&verb=Identify")
    assert etree.fromstring(response.content).find(f"{OAI}error").get("code") == "badVerb"
    response = hub.client.get("/oai?verb=ListSets&resumptionToken=a&resumptionToken=b")
    assert etree.fromstring(response.content).find(f"{OAI}error").get("code") == "badArgument"


def test_post_is_answered_like_get(hub: Hub) -> None:
    response = hub.client.post("/oai", data={"verb": "GetRecord", "metadataPrefix": "oai_dc",
                                             "identifier": "oai:hub:h1:oai:src:r2"})
    root = etree.fromstring(response.content)
    hub.schema.assertValid(root)
    assert root.findtext(f".//{OAI}identifier") == "oai:hub:h1:oai:src:r2"


def test_the_hub_name_is_part_of_the_identifiers(hub: Hub) -> None:
    named = make_hub(hub.engine, hub.schema, hub_name="hub.example.org")
    ids = identifiers(named.pages("ListIdentifiers", metadataPrefix="oai_dc", set="h1"))
    assert ids[0] == "oai:hub.example.org:h1:oai:src:r0"
    assert named.error(verb="GetRecord", identifier="oai:hub:h1:oai:src:r0",
                       metadataPrefix="oai_dc") == "idDoesNotExist"


def test_a_database_failure_is_a_503_without_a_traceback(hub: Hub,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlalchemy as sa

    from oaipmh_dagster.serve import queries

    def broken(*args: object, **kwargs: object) -> None:
        raise sa.exc.OperationalError("SELECT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(queries, "earliest", broken)
    response = hub.client.get("/oai", params={"verb": "Identify"})
    assert response.status_code == 503
    assert "Traceback" not in response.text and "database" in response.text


def test_a_lock_table_too_small_for_the_partitions_says_what_to_raise(
        hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL's answer when a list over every harvester needs more locks than its
    lock table holds (seen at 2,000 partitions with the defaults) names the setting."""
    import sqlalchemy as sa

    from oaipmh_dagster.serve import queries

    def out_of_locks(*args: object, **kwargs: object) -> None:
        raise sa.exc.OperationalError("SELECT", {}, Exception(
            "out of shared memory\nHINT:  You might need to increase "
            "max_locks_per_transaction."))

    monkeypatch.setattr(queries, "count", out_of_locks)
    response = hub.client.get("/oai", params={"verb": "ListRecords",
                                              "metadataPrefix": "oai_dc"})
    assert response.status_code == 503
    assert "max_locks_per_transaction" in response.text
    assert "lock slots" in response.text and "Traceback" not in response.text


def test_other_paths_are_not_found(hub: Hub) -> None:
    assert hub.client.get("/").status_code == 404


def test_metadata_without_a_namespace_stays_outside_the_oai_namespace(hub: Hub) -> None:
    """A record whose root has no namespace must not fall into the envelope's default
    namespace when embedded."""
    from oaipmh_dagster.oai.models import Header, Record
    from oaipmh_dagster_tests.serve.conftest import BASE, set_times, write

    write(hub.engine, "h1", [Record(Header("plain", "2001-01-01"),
                                    b"<record><title>plain</title></record>")])
    set_times(hub.engine, "h1", {"plain": BASE})
    response = hub.client.get("/oai", params={"verb": "GetRecord", "metadataPrefix": "oai_dc",
                                              "identifier": "oai:hub:h1:plain"})
    root = etree.fromstring(response.content)
    meta = root.find(f".//{OAI}metadata")
    assert meta is not None
    assert [el.tag for el in meta.iter()][1:] == ["record", "title"]
