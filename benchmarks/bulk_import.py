"""Case 20: the probe of `harvester import`. E endpoints (benchmark servers, each a
process of its own, answering after a latency), R rows per endpoint (different ids, the
same prefix): the import's plan with its bounded pool (each endpoint once, 8 at a time),
the same plan one endpoint at a time, and one probe per row in turn (what E x R
`harvester add` runs ask of the servers). Measured in this process, interleaved, the best
of the repeats; the ratios are what counts (the latency dominates)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from benchmarks.cases import Bench, Row
from benchmarks.pages import ServerProcess

ENDPOINTS, QUICK_ENDPOINTS = 16, 4
ROWS_PER_ENDPOINT = 5
LATENCY = 0.05
REPEATS = 3


def case_bulk_import(b: Bench) -> None:
    """Time the three ways of probing an import's endpoints."""
    from oaipmh_dagster.operations.admin import probe
    from oaipmh_dagster.operations.bulk import PROBE_WORKERS, plan_import
    from oaipmh_dagster.operations.harvester_files import Row as FileRow
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import Registry

    quick = b.sizes.list_sizes == (200,)  # `--quick`
    endpoints = QUICK_ENDPOINTS if quick else ENDPOINTS
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(ServerProcess(10, latency=LATENCY)).url
                for _ in range(endpoints)]
        rows = [FileRow(n, f"row {n}", {"id": f"h{n}", "url": url, "prefix": "oai_dc"})
                for n, url in enumerate([u for u in urls for _ in range(ROWS_PER_ENDPOINT)], 1)]
        registry = Registry(db.get_engine(b.sqlite_url("bulk_import")))

        def planned(workers: int) -> Callable[[], None]:
            def run() -> None:
                plan = plan_import(registry, rows, workers=workers)
                assert not plan.bad and len(plan.new) == len(rows), plan.bad
            return run

        def per_row() -> None:
            for row in rows:
                probe(str(row.values["url"]), "oai_dc", 30.0)

        ways = {"pool": planned(PROBE_WORKERS), "one at a time": planned(1),
                "a probe per row": per_row}
        best = {name: float("inf") for name in ways}
        for _ in range(REPEATS):
            for name, way in ways.items():
                t0 = time.perf_counter()
                way()
                best[name] = min(best[name], time.perf_counter() - t0)
    n = len(rows)
    label = f"{n} rows, {endpoints} endpoints, {LATENCY} s latency"
    b.add(Row("20", f"import probe, pool of {PROBE_WORKERS} ({label})", f"{best['pool']:.2f} s",
              f"{best['one at a time'] / best['pool']:.1f}x faster than one at a time, "
              f"{best['a probe per row'] / best['pool']:.1f}x than a probe per row",
              values={"seconds": best, "rows": n, "endpoints": endpoints}))
