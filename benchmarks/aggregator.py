"""Case 8: what schema validation and an XSLT crosswalk cost per record.

The same `harvest()` of the benchmark data set (oai_dc) into a fresh SQLite store, three
ways: plain (the built-in `oai_dc` transformer), with `schema=oai_dc` (every record
validated against the shipped oai_dc schema) and with `transformer=xslt:...` (an
oai_dc -> MODS crosswalk, the tests' stylesheet, instead of the built-in transformer).
Runs are interleaved (plain, validate, xslt, plain, ...), the median of each is reported
as a ratio of its time to the plain harvest's, and as extra microseconds per record."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.cases import ROOT, Bench, Row, _expected_digest, _fmt_rate

STYLESHEET = ROOT / "oaipmh_dagster_tests" / "transform" / "xsl" / "oai_dc_to_mods.xsl"
VARIANTS: tuple[tuple[str, dict[str, str]], ...] = (
    ("plain", {}),
    ("validate", {"schema": "oai_dc"}),
    ("xslt", {"transformer": f"xslt:{STYLESHEET}"}),
)


def case_aggregator(b: Bench) -> None:
    n = b.sizes.aggregator_records
    srv = b.server(n)
    expected = _expected_digest(n)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in VARIANTS}
    for _ in range(b.sizes.aggregator_repeats):
        for name, extra in VARIANTS:
            r = b.child("harvest", {"url": srv.url, "db": b.sqlite_url(f"agg-{name}"),
                                    **extra})
            if (r["stored"], r["digest"]) != expected:
                raise RuntimeError(f"{name}: the store differs from the data set "
                                   f"({r['stored']} stored, {expected[0]} expected)")
            runs[name].append(r)
    seconds = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
    cpu = {name: statistics.median(r["cpu"] for r in rs) for name, rs in runs.items()}
    plain = seconds["plain"]
    b.add(Row("8", f"harvest() {n:,} rec oai_dc -> SQLite, plain", _fmt_rate(n / plain),
              f"{plain:.2f} s, {cpu['plain']:.2f} CPU s (median of "
              f"{b.sizes.aggregator_repeats})", values={"seconds": plain, "cpu": cpu["plain"]}))
    for name, label in (("validate", "with schema validation (oai_dc)"),
                        ("xslt", "with an XSLT crosswalk (oai_dc -> MODS)")):
        ratio = seconds[name] / plain
        extra_us = (seconds[name] - plain) / n * 1e6
        extra_cpu_us = (cpu[name] - cpu["plain"]) / n * 1e6
        b.add(Row("8", f"harvest() {label}", f"{ratio:.2f}x the plain time",
                  f"{seconds[name]:.2f} s; {extra_us:+.0f} us/record wall, "
                  f"{extra_cpu_us:+.0f} us/record CPU",
                  values={"seconds": seconds[name], "cpu": cpu[name], "ratio": ratio,
                          "extra_us_per_record": extra_us,
                          "extra_cpu_us_per_record": extra_cpu_us}))
    b.raw["aggregator"] = {"records": n, "runs": runs}
