"""Hostile stylesheets: a record that makes a crosswalk run for ever, produce huge
output, fill memory or read /etc/passwd fails alone (transform_failed, raw XML kept)
while the others transform; a harvest stuck in a stylesheet stops on SIGTERM. SQLite
and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.harvesting.harvest import harvest
from oaipmh_dagster.oai import ClientOptions
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster.transform import TransformError, transformer_identity, xslt
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

FAST = ClientOptions(max_retries=2, backoff_base=0.01, backoff_max=0.05, read_timeout=5)
STOP_WITHIN = 20.0  # seconds from SIGTERM to the CLI's exit (generous: a loaded machine)

# 2**n calls of a template that never gets deeper than n: no recursion limit stops it.
SPIN = """
  <xsl:template name="spin"><xsl:param name="n"/><xsl:param name="leaf"/>
    <xsl:choose>
      <xsl:when test="$n &gt; 0">
        <xsl:call-template name="spin"><xsl:with-param name="n" select="$n - 1"/>
          <xsl:with-param name="leaf" select="$leaf"/></xsl:call-template>
        <xsl:call-template name="spin"><xsl:with-param name="n" select="$n - 1"/>
          <xsl:with-param name="leaf" select="$leaf"/></xsl:call-template>
      </xsl:when>
      <xsl:when test="$leaf"><leaf>0123456789012345678901234567890123456789</leaf></xsl:when>
    </xsl:choose>
  </xsl:template>"""
HOSTILE = {
    "endless": '<xsl:call-template name="spin"><xsl:with-param name="n" select="60"/>'
               '<xsl:with-param name="leaf" select="false()"/></xsl:call-template>',
    # 2**18 leaves of 51 bytes: 13 MB, over the default output budget of 10 MiB.
    "huge": '<out><xsl:call-template name="spin"><xsl:with-param name="n" select="18"/>'
            '<xsl:with-param name="leaf" select="true()"/></xsl:call-template></out>',
    # A result tree fragment of 2**24 leaves, never output: only memory grows.
    "memory": '<xsl:variable name="v"><xsl:call-template name="spin"><xsl:with-param '
              'name="n" select="24"/><xsl:with-param name="leaf" select="true()"/>'
              '</xsl:call-template></xsl:variable><out><xsl:value-of select="$v"/></out>',
    "passwd": "<out><xsl:copy-of select=\"document('/etc/passwd')\"/></out>",
}
LIMITS = {"endless": "xslt.timeout=2", "huge": "xslt.timeout=120",
          "memory": "xslt.timeout=5&xslt.max-memory=200M", "passwd": ""}
NEEDLE = {"endless": "time budget of 2 s", "huge": "exceeds the output budget of 10,485,760",
          "memory": "memory ceiling of 200 MiB", "passwd": "reading /etc/passwd refused"}


def _crosswalk(folder: Path, hostile: str) -> Path:
    """Each record becomes <out><t>title</t><l>(from lookup.xml beside it)</l></out>;
    the record whose title is the `poison` parameter gets the hostile template."""
    (folder / "lookup.xml").write_text("<map><e>looked up</e></map>", encoding="utf-8")
    path = folder / "crosswalk.xsl"
    path.write_text(f"""<xsl:stylesheet version="1.0"
    xmlns:xsl="http://www.w3.org/1999/XSL/Transform"
    xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"
    xmlns:dc="http://purl.org/dc/elements/1.1/">
  <xsl:param name="poison"/>{SPIN}
  <xsl:template match="/oai_dc:dc">
    <xsl:choose>
      <xsl:when test="dc:title = $poison">{hostile}</xsl:when>
      <xsl:otherwise><out><t><xsl:value-of select="dc:title"/></t>
        <l><xsl:value-of select="document('lookup.xml')/map/e"/></l></out></xsl:otherwise>
    </xsl:choose>
  </xsl:template>
</xsl:stylesheet>
""", encoding="utf-8")
    return path


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_record_fails_alone(database_url: str, tmp_path: Path, kind: str) -> None:
    dataset = make_dataset(30, seed=5, deleted_ratio=0.0)
    victim = dataset.records[12]
    title = victim.metadata["oai_dc"].split("<dc:title>")[1].split("</dc:title>")[0]
    spec = f"xslt:{_crosswalk(tmp_path, HOSTILE[kind])}?poison={quote(title)}"
    spec += f"&{LIMITS[kind]}" if LIMITS[kind] else ""
    with OAIServer(dataset, page_size=10) as server:
        h = Harvester(id="x", base_url=server.base_url, metadata_prefix="oai_dc",
                      transformer=spec)
        stats = harvest(h, Store(), run_id="r1", options=FAST)
    assert stats.records == 30 and stats.failed == 1
    records = {r["oai_identifier"]: r for r in Store().iter_records("x", with_raw=True)}
    bad = records.pop(victim.identifier)
    (err,) = bad["errors"]
    assert err["type"] == "transform_failed" and NEEDLE[kind] in err["message"], err
    assert bad["metadata"] is None and bad["raw_xml"].startswith("<oai_dc:dc")
    assert len(records) == 29
    for rec in records.values():
        assert not rec["errors"], rec["errors"]
        assert rec["metadata"]["out/l"] == ["looked up"], rec


def test_limits_from_the_spec_and_the_environment(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = _crosswalk(tmp_path, "")
    monkeypatch.setenv("OAIPMH_XSLT_TIMEOUT", "7.5")
    monkeypatch.setenv("OAIPMH_XSLT_MAX_MEMORY", "512M")
    params, limits = xslt.split_limits(
        "s", {"a": "1", "xslt.max-output": "2K", "xslt.max-memory": "1G"})
    assert params == {"a": "1"}
    assert (limits.seconds, limits.max_output, limits.max_memory) == (7.5, 2048, 2**30)
    for bad in ("xslt.timeout=0", "xslt.timeout=soon", "xslt.max-output=1T",
                "xslt.max-memory=1M"):
        with pytest.raises(TransformError, match="bad parameter xslt") as info:
            xslt.XsltTransformer(f"xslt:{path}?{bad}")
        assert info.value.type == "bad_stylesheet"
    monkeypatch.setenv("OAIPMH_XSLT_TIMEOUT", "-1")
    with pytest.raises(TransformError, match=r"bad \$OAIPMH_XSLT_TIMEOUT '-1'"):
        xslt.XsltTransformer(f"xslt:{path}")
    monkeypatch.delenv("OAIPMH_XSLT_TIMEOUT")
    # The limits do not change what a record becomes: not part of its content hash.
    assert (transformer_identity(f"xslt:{path}?a=1&xslt.timeout=9")
            == transformer_identity(f"xslt:{path}?a=1"))
    assert transformer_identity(f"xslt:{path}?xslt.timeout=9").startswith(f"xslt:{path}\x1f")


def _workers(parent: int | None = None) -> dict[int, float]:
    """The stylesheet workers (of `parent`, or all) and the CPU seconds of each."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"_xslt_worker.py" in cmdline and parent in (None, int(stat[1])):
            found[int(pid)] = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_cli_harvest_stuck_in_a_stylesheet_stops_on_sigterm(database_url: str,
                                                              tmp_path: Path) -> None:
    """Every record spins (time budget one hour); once a worker has burnt a second of
    CPU, SIGTERM ends `oaipmh-dagster harvest` within seconds: exit 1, interrupted."""
    spec = f"xslt:{_crosswalk(tmp_path, HOSTILE['endless'])}?xslt.timeout=3600"
    (tmp_path / "crosswalk.xsl").write_text(
        (tmp_path / "crosswalk.xsl").read_text().replace("dc:title = $poison", "true()"))
    with OAIServer(make_dataset(20, seed=5, deleted_ratio=0.0), page_size=10) as server:
        add_harvester("stuck", server.base_url, transformer=spec)
        env = {**os.environ, "OAIPMH_DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}
        exe = str(Path(sys.executable).with_name("oaipmh-dagster"))
        proc = subprocess.Popen([exe, "harvest", "stuck"], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while sum((workers := _workers(proc.pid)).values()) < 1.0:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "no stylesheet worker ever ran"
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            out = proc.communicate(timeout=STOP_WITHIN)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
    assert proc.returncode == 1, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("oaipmh-dagster: error: run ") and "interrupted" in last, out
    deadline = time.monotonic() + STOP_WITHIN  # no worker left behind
    while set(workers) & set(_workers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(workers) & set(_workers())
