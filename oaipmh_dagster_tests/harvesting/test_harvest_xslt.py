"""A harvest with an xslt: transformer: transformed records stored, failing records keep
their raw XML, and an edited stylesheet re-transforms unchanged records."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.harvesting.harvest import harvest
from oaipmh_dagster.oai import ClientOptions
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster_tests.memory_store import MemoryStore
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

FAST = ClientOptions(max_retries=2, backoff_base=0.01, backoff_max=0.05, read_timeout=5)
XSL = Path(__file__).parents[1] / "transform" / "xsl"


@pytest.fixture
def server():  # noqa: ANN201
    with OAIServer(make_dataset(300, seed=3, deleted_ratio=0.05), page_size=100) as srv:
        yield srv


def _picky_crosswalk(path: Path, reject_last_digit: str) -> None:
    """The shipped MODS crosswalk, refusing records whose first identifier ends with
    the given digit."""
    path.write_text(f"""<xsl:stylesheet version="1.0"
    xmlns:xsl="http://www.w3.org/1999/XSL/Transform"
    xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"
    xmlns:dc="http://purl.org/dc/elements/1.1/">
  <xsl:import href="{XSL / 'oai_dc_to_mods.xsl'}"/>
  <xsl:template match="/oai_dc:dc[substring(dc:identifier[1],
      string-length(dc:identifier[1])) = '{reject_last_digit}']">
    <xsl:message terminate="yes">rejected <xsl:value-of select="dc:identifier[1]"/></xsl:message>
  </xsl:template>
</xsl:stylesheet>
""", encoding="utf-8")


def test_harvest_with_xslt(memory_store: MemoryStore, server: OAIServer,
                           tmp_path: Path) -> None:
    sheet = tmp_path / "crosswalk.xsl"
    _picky_crosswalk(sheet, "7")
    h = Harvester(id="x", base_url=server.base_url, metadata_prefix="oai_dc",
                  transformer=f"xslt:{sheet}?source=Demo%20repository")
    store = memory_store
    live = sum(1 for r in server.dataset if not r.deleted)
    rejected = sum(1 for r in server.dataset if not r.deleted
                   and r.metadata["oai_dc"].split("</dc:identifier>")[0][-1] == "7")
    assert 0 < rejected < live

    stats = harvest(h, store, run_id="r1", options=FAST)
    assert stats.records == 300 and stats.failed == rejected
    records = list(store.iter_records("x", with_raw=True))
    good = [r for r in records if not r["deleted"] and not r["errors"]]
    bad = [r for r in records if r["errors"]]
    assert len(good) == live - rejected and len(bad) == rejected
    for rec in good:
        meta = rec["metadata"]
        assert meta["titles"] and meta["record_source"] == "Demo repository"  # as MODS
    for rec in bad:
        (err,) = rec["errors"]
        assert err["type"] == "transform_failed" and "rejected https://" in err["message"]
        assert err["location"] == h.transformer
        assert rec["metadata"] is None and rec["raw_xml"].startswith("<oai_dc:dc")

    # Unchanged stylesheet and records: only the failed records are tried again.
    again = harvest(h, store, run_id="r2", options=FAST)
    assert again.new == 0 and again.updated == rejected and again.failed == rejected
    assert again.unchanged == 300 - rejected

    # An edited crosswalk re-transforms every live record, although none changed.
    _picky_crosswalk(sheet, "none")
    os.utime(sheet, ns=(10**18, 10**18))
    third = harvest(h, store, run_id="r3", options=FAST)
    assert third.failed == 0 and third.updated == live and third.new == 0
    assert all(r["metadata"]["record_source"] == "Demo repository" and not r["errors"]
               for r in store.iter_records("x") if not r["deleted"])
    fourth = harvest(h, store, run_id="r4", options=FAST)
    assert fourth.unchanged == 300
