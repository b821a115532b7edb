"""`make bench`: run the benchmark cases, print a table, write JSON to benchmarks/results/.

    python -m benchmarks.run                 # every case, full sizes
    python -m benchmarks.run --quick         # small sizes (a smoke run)
    python -m benchmarks.run --cases 1,2     # some cases only
    python -m benchmarks.run --cases 6 --shards-10k   # case 6 also at 10,000 harvesters
    python -m benchmarks.run --cases 13 --list-sizes 1000   # case 13 at 1,000 only

See benchmarks/README.md for what each case measures and how to read the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from tabulate import tabulate

from benchmarks.cases import CASES, RESULTS, ROOT, Bench, Row, Sizes, rows_as_dicts

PACKAGES = ("oaipmh-dagster", "dagster", "httpx", "lxml", "SQLAlchemy", "psycopg2-binary",
            "Sickle", "requests", "oaipmh-scythe", "httpx2", "pyinstrument")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def _git() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {}


def _table(rows: list[Row]) -> str:
    return tabulate([[r.case, r.measurement, r.result, r.compare, r.target, r.ok] for r in rows],
                    headers=["#", "measurement", "result", "compared with", "target", ""],
                    tablefmt="github", disable_numparse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="oaipmh-dagster benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated case numbers ({','.join(CASES)})")
    parser.add_argument("--output", type=Path, default=RESULTS,
                        help="directory for the JSON results and the profile")
    parser.add_argument("--shards-10k", action="store_true",
                        help="case 6 also at 10,000 harvesters (about 8 GB of RAM; also "
                        "OAIPMH_BENCH_10K=1)")
    parser.add_argument("--shard-sizes", help="case 6 at these harvester counts instead "
                        "(comma-separated, e.g. 3000,10000)")
    parser.add_argument("--dev-sizes", help="case 11 at these harvester counts instead "
                        "(comma-separated; K: 12 at 3,000, else N / per-shard)")
    parser.add_argument("--list-sizes", help="case 13 at these harvester counts instead "
                        "(comma-separated, e.g. 1000,10000)")
    parser.add_argument("--store-sizes", help="case 15 at these store sizes (records of "
                        "other harvesters, comma-separated, e.g. 1000000,10000000)")
    parser.add_argument("--store-layouts", help="case 15 on these schema revisions "
                        "(comma-separated: head, 0009)")
    parser.add_argument("--cli-records", type=int, help="case 7 at this many records "
                        "(default 500,000)")
    parser.add_argument("--per-shard", type=int, help="case 6: harvesters per location "
                        "(K = ceil(N / per-shard))")
    parser.add_argument("--no-scheduler", action="store_true",
                        help="case 6 without the scheduler iterations (at 10,000 the daemon's "
                        "first iteration alone takes minutes)")
    args = parser.parse_args(argv)
    # SIGTERM ends the run through the cases' `finally`, which end their servers' groups.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    selected = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in selected if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.shards_10k or os.environ.get("OAIPMH_BENCH_10K") == "1":
        sizes.shard_sizes = (*sizes.shard_sizes, 10_000)
        sizes.dev_sizes = (*sizes.dev_sizes, 10_000)
    if args.shard_sizes:
        sizes.shard_sizes = tuple(int(x) for x in args.shard_sizes.split(","))
    if args.dev_sizes:
        sizes.dev_sizes = tuple(int(x) for x in args.dev_sizes.split(","))
    if args.list_sizes:
        sizes.list_sizes = tuple(int(x) for x in args.list_sizes.split(","))
    if args.store_sizes:
        sizes.store_sizes = tuple(int(x) for x in args.store_sizes.split(","))
    if args.store_layouts:
        sizes.store_layouts = tuple(x.strip() for x in args.store_layouts.split(","))
    if args.cli_records:
        sizes.cli_records = args.cli_records
    if args.per_shard:
        sizes.per_shard = args.per_shard
    if args.no_scheduler:
        sizes.shard_scheduler = False
    args.output.mkdir(parents=True, exist_ok=True)
    bench = Bench(sizes, args.output, echo=lambda s: print(s, flush=True))
    started = datetime.now(UTC)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    durations: dict[str, float] = {}
    errors: dict[str, str] = {}
    print(f"oaipmh-dagster benchmarks ({'quick' if args.quick else 'full'}), cases "
          f"{','.join(selected)}; {os.cpu_count()} CPUs, load average "
          f"{load_before[0]:.1f}", flush=True)
    try:
        for case in selected:
            title, fn = CASES[case]
            print(f"case {case}: {title}", flush=True)
            c0 = time.perf_counter()
            try:
                fn(bench)
            except Exception as exc:  # noqa: BLE001 - one broken case must not hide the others
                errors[case] = traceback.format_exc()
                bench.add(Row(case, title, "ERROR", str(exc).splitlines()[0] if str(exc)
                              else type(exc).__name__))
            durations[case] = time.perf_counter() - c0
    finally:
        bench.close()
    total = time.perf_counter() - t0
    load_after = os.getloadavg()
    table = _table(bench.rows)
    print()
    print(table)
    print(f"\n{total:.0f} s in all; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after (on {os.cpu_count()} CPUs: figures are noisy when it "
          "is high)")
    result = {
        "started": started.isoformat(),
        "quick": args.quick,
        "cases": selected,
        "sizes": sizes.__dict__,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_before": load_before, "load_after": load_after},
        "versions": _versions(),
        "git": _git(),
        "seconds": total,
        "case_seconds": durations,
        "rows": rows_as_dicts(bench.rows),
        "raw": bench.raw,
        "errors": errors,
        "table": table,
    }
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out = args.output / f"bench-{stamp}{'-quick' if args.quick else ''}.json"
    text = json.dumps(result, indent=2, default=str)
    out.write_text(text, encoding="utf-8")
    (args.output / "latest.json").write_text(text, encoding="utf-8")
    print(f"results: {out}")
    for case, tb in errors.items():
        print(f"\ncase {case} failed:\n{tb}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
