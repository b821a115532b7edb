"""Resumption tokens: self-contained, signed, and stable while the hub keeps writing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from oaipmh_dagster.oai.models import Header, Record
from oaipmh_dagster.serve.tokens import (
    BadToken,
    ListToken,
    decode_list,
    decode_sets,
    encode_list,
)
from oaipmh_dagster_tests.serve.conftest import OAI, Hub, dc, identifiers, make_hub, write

AT = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _token(**changes: object) -> ListToken:
    values: dict = {"verb": "ListRecords", "prefix": "oai_dc", "set_spec": "h1:a",
                    "lower": None, "upper": AT, "after": (AT, "h1", "oai:x:1"), "cursor": 4,
                    "total": 9}
    values.update(changes)
    return ListToken(**values)


def test_a_token_carries_its_position_exactly() -> None:
    t = _token()
    assert decode_list(encode_list(t, "s"), "ListRecords", "s") == t


@pytest.mark.parametrize("tamper", [
    lambda v: v[:-2] + ("AA" if not v.endswith("AA") else "BB"),  # the signature
    lambda v: "x" + v,  # the body
    lambda v: v.replace(".", ""),
    lambda v: v + ".x",
])
def test_an_altered_token_is_refused(tamper) -> None:  # noqa: ANN001 - a lambda
    with pytest.raises(BadToken):
        decode_list(tamper(encode_list(_token(), "s")), "ListRecords", "s")


def test_a_token_of_another_secret_or_verb_is_refused() -> None:
    value = encode_list(_token(), "s")
    with pytest.raises(BadToken):
        decode_list(value, "ListRecords", "other")
    with pytest.raises(BadToken):
        decode_list(value, "ListIdentifiers", "s")
    with pytest.raises(BadToken):
        decode_sets(value, "s")


def test_another_server_process_continues_a_list(hub: Hub) -> None:
    """Tokens hold everything: a second app on the same database takes the list on."""
    first = hub.get(verb="ListIdentifiers", metadataPrefix="oai_dc")
    token = first.findtext(f"{OAI}ListIdentifiers/{OAI}resumptionToken")
    other = make_hub(hub.engine, hub.schema)
    second = other.get(verb="ListIdentifiers", resumptionToken=token or "")
    assert identifiers([second]) == [f"oai:hub:h1:oai:src:r{i}" for i in range(4, 8)]
    # A token made with another secret is not this hub's.
    signed = make_hub(hub.engine, hub.schema, token_secret="elsewhere")
    assert signed.error(verb="ListIdentifiers", resumptionToken=token or "") == (
        "badResumptionToken")
    assert hub.error(verb="ListRecords", resumptionToken=token or "") == "badResumptionToken"


def test_writes_between_pages_neither_skip_nor_repeat_unchanged_records(hub: Hub) -> None:
    """Between the pages of a list the hub rewrites records (some already delivered,
    some not), harvests new ones and re-harvests unchanged ones: every unchanged record
    comes exactly once, no identifier twice; the changed and the new come with the next
    incremental list, from the first responseDate."""
    first = hub.get(verb="ListRecords", metadataPrefix="oai_dc")
    response_date = first.findtext(f"{OAI}responseDate") or ""
    pages = [first]
    changed = {"oai:src:r1", "oai:src:r8"}  # h1's r1 was delivered, r8 was not yet
    write(hub.engine, "h1", [Record(Header(i, "2001-01-02"), dc(f"{i} changed"))
                             for i in sorted(changed)])
    write(hub.engine, "h2", [Record(Header("oai:src:new", "2001-01-02"), dc("new"))])
    # An unchanged re-harvest writes nothing (same content hash): nothing moves.
    write(hub.engine, "h2", [Record(Header(f"oai:src:r{i}", "2001-01-01"), dc(f"h2 r{i}"))
                             for i in (0, 6, 9)])
    token = first.findtext(f".//{OAI}resumptionToken")
    while token:
        page = hub.get(verb="ListRecords", resumptionToken=token)
        pages.append(page)
        write(hub.engine, "h2", [Record(Header("oai:src:r9", "2001-01-03"), dc("h2 r9 v2"))])
        token = page.findtext(f".//{OAI}resumptionToken")
    got = identifiers(pages)
    assert len(got) == len(set(got))
    unchanged = ({f"oai:hub:h1:oai:src:r{i}" for i in range(10)}
                 | {f"oai:hub:h2:oai:src:r{i}" for i in range(10)}) - {
        "oai:hub:h1:oai:src:r8", "oai:hub:h2:oai:src:r9"}
    assert unchanged <= set(got)
    assert "oai:hub:h2:oai:src:new" not in got
    # The next incremental harvest (a second later) takes the rest on from the first
    # responseDate.
    def a_second_later() -> datetime:
        return datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)

    later_hub = make_hub(hub.engine, hub.schema, clock=a_second_later)
    later = identifiers(later_hub.pages("ListIdentifiers", metadataPrefix="oai_dc",
                                  **{"from": response_date}))
    assert set(later) == {"oai:hub:h1:oai:src:r1", "oai:hub:h1:oai:src:r8",
                          "oai:hub:h2:oai:src:new", "oai:hub:h2:oai:src:r9"}


def test_the_last_page_has_an_empty_token_with_the_cursor(hub: Hub) -> None:
    pages = hub.pages("ListIdentifiers", metadataPrefix="oai_dc", set="h1")
    last = pages[-1].find(f"{OAI}ListIdentifiers/{OAI}resumptionToken")
    assert last is not None and not last.text
    assert (last.get("cursor"), last.get("completeListSize")) == ("8", "10")


def test_a_list_on_one_page_has_no_token(hub: Hub) -> None:
    root = hub.get(verb="ListIdentifiers", metadataPrefix="oai_dc", set="h1:physics",
                   until="2024-05-01T12:00:03Z")
    assert root.find(f".//{OAI}resumptionToken") is None
    assert identifiers([root]) == ["oai:hub:h1:oai:src:r1", "oai:hub:h1:oai:src:r3"]
