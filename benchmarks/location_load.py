"""Case 12: the load of one code location of N harvesters (200: a shard's size, and
1,000), built through today's public builders and through the private ones they
replaced (`benchmarks.load_paths`), in fresh processes, interleaved (private, public,
private, ...) so that a change in machine load hits both. Each load is what a code
server does before it answers: build the Definitions, resolve the repository and its
jobs, serialize the repository snapshot (`child.location_load`). CPU seconds are the
steadier figure on a busy machine; wall seconds are shown too. Target: public within
1 s of private at 200 harvesters. Once, at the first size, `location_resolved` (each
job left to the location's Definitions to resolve) shows why the jobs are resolved
against the harvester's own assets."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.cases import Bench, Row

TARGET_SECONDS = 1.0


def _pairs(b: Bench, n: int, repeats: int) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {"private": [], "public": []}
    for _ in range(repeats):
        for path in runs:
            runs[path].append(b.child("location_load", {"n": n, "path": path}, timeout=1800))
    return runs


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def case_location_load(b: Bench) -> None:
    """Case 12: public vs private builders, one location of N harvesters."""
    out: dict[str, Any] = {}
    for i, n in enumerate(b.sizes.load_sizes):
        runs = _pairs(b, n, b.sizes.load_repeats if i == 0 else 1)
        cpu = {p: _median(r, "cpu_seconds") for p, r in runs.items()}
        wall = {p: _median(r, "seconds") for p, r in runs.items()}
        extra = cpu["public"] - cpu["private"]
        same = {p: {r["snapshot_bytes"] for r in rs} for p, rs in runs.items()}
        out[n] = {"runs": runs, "cpu": cpu, "wall": wall, "extra_cpu": extra}
        parts = ", ".join(f"{k} {_median(runs['public'], k + '_cpu'):.2f} s "
                          f"(private {_median(runs['private'], k + '_cpu'):.2f} s)"
                          for k in ("build", "resolve", "snapshot"))
        row = Row("12", f"location load, {n:,} harvesters: public (CPU)",
                  f"{cpu['public']:.2f} s",
                  f"private {cpu['private']:.2f} s: x{cpu['public'] / cpu['private']:.2f}, "
                  f"+{extra:.2f} s; wall {wall['public']:.1f} s vs {wall['private']:.1f} s; "
                  f"{parts}; snapshot bytes {sorted(same['public'])} vs "
                  f"{sorted(same['private'])}; median of {len(runs['public'])}",
                  values=out[n])
        if i == 0:
            row.target = f"<= +{TARGET_SECONDS:.0f} s"
            row.ok = "ok" if extra <= TARGET_SECONDS else "MISS"
        b.add(row)
    if b.sizes.load_sizes:
        n = b.sizes.load_sizes[0]
        r = b.child("location_load", {"n": n, "path": "location_resolved"}, timeout=3600)
        out["location_resolved"] = r
        b.add(Row("12", f"location load, {n:,} harvesters: jobs resolved by the location",
                  f"{r['cpu_seconds']:.2f} s",
                  f"resolve {r['resolve_cpu']:.2f} s, snapshot {r['snapshot_cpu']:.2f} s "
                  f"(CPU); wall {r['seconds']:.1f} s", values=r))
    b.raw["location_load"] = out
