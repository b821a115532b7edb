"""A hub to serve: two harvesters in oai_dc and one in MARC, records written by the real
write path and then given fixed change times, and the response schema to check with."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from lxml import etree
from sqlalchemy.engine import Engine
from starlette.testclient import TestClient

from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.oai.models import Header, Record
from oaipmh_dagster.serve import SCHEMA, Settings, create_app
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster.storage.store import Store, record_table

OAI = "{http://www.openarchives.org/OAI/2.0/}"
NS = {"o": OAI[1:-1]}
DC_SCHEMA = Path(db.__file__).parents[1] / "transform" / "schemas" / "oai_dc.xsd"
DC = ('<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
      'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{}</dc:title></oai_dc:dc>')
# The fixed change time of the first record; record i changed i seconds later.
BASE = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def dc(title: str) -> bytes:
    return DC.format(title).encode()


@pytest.fixture(scope="session")
def oai_schema(tmp_path_factory: pytest.TempPathFactory) -> etree.XMLSchema:
    """The shipped OAI-PMH schema with oai_dc's, so strict metadata wildcards validate."""
    folder = tmp_path_factory.mktemp("schemas")
    (folder / "all.xsd").write_text(
        '<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">'
        f'<xs:import namespace="http://www.openarchives.org/OAI/2.0/" '
        f'schemaLocation="{SCHEMA.as_uri()}"/>'
        f'<xs:import namespace="http://www.openarchives.org/OAI/2.0/oai_dc/" '
        f'schemaLocation="{DC_SCHEMA.as_uri()}"/></xs:schema>', encoding="utf-8")
    return etree.XMLSchema(etree.parse(str(folder / "all.xsd")))


def write(engine: Engine, harvester_id: str, records: list[Record]) -> None:
    write_page(Store(engine), harvester_id, records, run_id=None)


def set_times(engine: Engine, harvester_id: str, times: dict[str, datetime]) -> None:
    """Give stored records fixed change times."""
    c = record_table.c
    with engine.begin() as conn:
        conn.execute(record_table.update()
                     .where(c.harvester_id == sa.bindparam("h"),
                            c.oai_identifier == sa.bindparam("i"))
                     .values(harvested_at=sa.bindparam("t")),
                     [{"h": harvester_id, "i": i, "t": t} for i, t in times.items()])


@dataclass
class Hub:
    engine: Engine
    client: TestClient
    schema: etree.XMLSchema

    def get(self, **params: str) -> etree._Element:
        """One response, parsed and checked against the OAI-PMH schema."""
        response = self.client.get("/oai", params=params)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/xml")
        root = etree.fromstring(response.content)
        self.schema.assertValid(root)
        return root

    def error(self, **params: str) -> str:
        """The error code of a response that must be one error."""
        root = self.get(**params)
        (err,) = root.findall(f"{OAI}error")
        return str(err.get("code"))

    def pages(self, verb: str, **params: str) -> list[etree._Element]:
        """Every page of a list, following its tokens (at most 200)."""
        out = [self.get(verb=verb, **params)]
        for _ in range(200):
            token = out[-1].find(f"{OAI}{verb}/{OAI}resumptionToken")
            if token is None or not (token.text or ""):
                return out
            out.append(self.get(verb=verb, resumptionToken=token.text))
        raise AssertionError("the list did not end")


def identifiers(pages: list[etree._Element]) -> list[str]:
    return [el.text or "" for p in pages for el in p.iterfind(f".//{OAI}header/{OAI}identifier")]


def make_hub(engine: Engine, schema: etree.XMLSchema, *,
             clock: Callable[[], datetime] | None = None, **settings: Any) -> Hub:
    """The hub's app (4 per page) on `engine`; `clock` gives the response times."""
    app = create_app(engine, Settings(**{"page_size": 4, **settings}), cache_seconds=0,
                     clock=clock)
    return Hub(engine, TestClient(app), schema)


@pytest.fixture
def hub(database_url: str, oai_schema: etree.XMLSchema) -> Hub:
    """h1 and h2 (oai_dc) hold 10 records each under the same source identifiers (h2's
    r3 deleted), h1's in source sets; m1 (marc21) holds none; changes one second apart,
    h1's first."""
    engine = db.get_engine(database_url)
    registry = Registry(engine)
    registry.add(Harvester(id="h1", base_url="http://one.example.org/oai",
                           metadata_prefix="oai_dc", name="First", sets=("physics",)))
    registry.add(Harvester(id="h2", base_url="http://two.example.org/oai",
                           metadata_prefix="oai_dc"))
    registry.add(Harvester(id="m1", base_url="http://three.example.org/oai",
                           metadata_prefix="marc21"))
    write(engine, "h1", [Record(Header(f"oai:src:r{i}", "2001-01-01",
                                       ("physics",) if i % 2 else ("chemistry",)),
                                dc(f"h1 r{i}")) for i in range(10)])
    write(engine, "h2", [Record(Header(f"oai:src:r{i}", "2001-01-01", (), i == 3),
                                None if i == 3 else dc(f"h2 r{i}")) for i in range(10)])
    set_times(engine, "h1", {f"oai:src:r{i}": BASE + timedelta(seconds=i) for i in range(10)})
    set_times(engine, "h2", {f"oai:src:r{i}": BASE + timedelta(seconds=10 + i)
                             for i in range(10)})
    return make_hub(engine, oai_schema)


@dataclass
class Running:
    url: str
    engine: Engine


@pytest.fixture
def served(hub: Hub) -> Iterator[Running]:
    """The hub under uvicorn on a loopback port, in a thread of this process."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(hub.engine, Settings(page_size=3),
                                                      cache_seconds=0),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the server did not start"
    try:
        yield Running(f"http://127.0.0.1:{port}/oai", hub.engine)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
