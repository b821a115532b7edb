"""The shipped demo server is fault-free; tests alter its replies through one hook."""

from __future__ import annotations

from pathlib import Path

import httpx

import oaipmh_dagster
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer, Reply, RequestInfo, Wire

DEMO = Path(oaipmh_dagster.__file__).parent / "demo"


def test_the_demo_ships_no_fault_injection() -> None:
    for path in DEMO.rglob("*.py"):
        text = path.read_text()
        for marker in ("<!ENTITY", "FaultPlan", "FAULT_KINDS", "billion_laughs"):
            assert marker not in text, f"{path.name} holds {marker!r}"


class _Teapot(OAIServer):
    """Answers Identify with 418 and writes ListSets pages one byte at a time."""

    def handle(self, request: RequestInfo) -> Reply:
        if request.verb == "Identify":
            return Reply(418, "short and stout\n", "text/plain")
        reply = self.respond(request)
        if request.verb == "ListSets":
            reply.writer = _bytewise
        return reply


def _bytewise(wire: Wire, body: bytes) -> None:
    for i in range(len(body)):
        wire.write(body[i : i + 1])


def test_handle_replaces_or_alters_a_reply() -> None:
    with _Teapot(make_dataset(20, sets=2), gzip=False) as server:
        teapot = httpx.get(server.base_url, params={"verb": "Identify"})
        sets = httpx.get(server.base_url, params={"verb": "ListSets"})
        plain = httpx.get(server.base_url, params={"verb": "ListMetadataFormats"})
    assert (teapot.status_code, teapot.text) == (418, "short and stout\n")
    assert sets.status_code == 200 and "<ListSets><set>" in sets.text
    assert "<ListMetadataFormats>" in plain.text
    logs = server.requests
    assert [log.status for log in logs] == [418, 200, 200]
    assert logs[1].bytes_sent == len(sets.content)


def test_an_aborted_reply_drops_the_connection() -> None:
    class Down(OAIServer):
        def handle(self, request: RequestInfo) -> Reply:
            return Reply(abort=True)

    with Down(make_dataset(5)) as server:
        try:
            httpx.get(server.base_url, params={"verb": "Identify"}, timeout=5)
        except httpx.TransportError:
            pass
        else:
            raise AssertionError("the request should fail")
    assert [log.status for log in server.requests] == [0]
