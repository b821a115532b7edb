"""The benchmark cases. Each runs its measurements in fresh child processes
(`benchmarks.child`) against servers in processes of their own (`benchmarks.pages`),
and adds rows to the table."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.pages import ServerProcess, dataset_for

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PG_ADMIN_URL = os.environ.get("OAIPMH_BENCH_POSTGRES_URL",
                              "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
LOCATION = "oaipmh_dagster"


@dataclass
class Sizes:
    """Problem sizes of a run (`--quick` shrinks them)."""

    fetch_records: int = 20_000
    fetch_repeats: int = 3
    e2e_records: int = 20_000
    cli_records: int = 500_000  # case 7 (#26; #16 measured it at 60,000)
    cli_repeats: int = 2
    latency_records: int = 50_000
    latency: float = 0.1
    page_size: int = 100
    windowed_parallel: int = 4
    memory_records: tuple[int, int] = (20_000, 200_000)
    definitions: tuple[int, ...] = (100, 300, 1000)
    reloads: tuple[int, ...] = (300, 1000)
    reload_repeats: int = 2  # at 1,000 harvesters: once (a reload takes a minute there)
    shard_sizes: tuple[int, ...] = (1000, 3000)  # + 10,000 with --shards-10k
    per_shard: int = 200  # K = ceil(N / per_shard) code locations
    shard_scheduler: bool = True  # measure the scheduler daemon's iterations too
    shard_baseline: int = 1000  # N of the one-location (K=1) comparison
    dev_sizes: tuple[int, ...] = (3000,)  # case 11 (+ 10,000 with --shards-10k)
    dev_shards: dict[int, int] = field(default_factory=lambda: {3000: 12})  # else N / per_shard
    compression_records: int = 50_000  # case 14
    scale_records: int = 100_000  # case 15: the harvester measured
    store_sizes: tuple[int, ...] = (1_000_000, 10_000_000)  # case 15, each vs an empty one
    store_layouts: tuple[str, ...] = ("head",)  # case 15 ("0009" too: the one table)
    scale_repeats: int = 2  # case 15: harvests per store, interleaved with the empty one
    removal_records: int = 100_000  # case 16: the harvester removed / re-harvested
    removal_store: int = 1_500_000  # case 16: other harvesters' records
    rewrites: int = 5  # case 16: full re-harvests that change every record
    aggregator_records: int = 20_000
    aggregator_repeats: int = 3
    load_sizes: tuple[int, ...] = (200, 1000)  # case 12: private vs public builders
    load_repeats: int = 3  # interleaved pairs at the first size (one at the others)
    list_sizes: tuple[int, ...] = (1000, 10_000)  # case 13: harvester list, since
    serve_store: int = 1_000_000  # case 17: records in the store
    serve_records: int = 100_000  # case 17: records read per list
    frames_records: int = 1_000_000  # case 18: downstream DataFrame vs batches
    frames_batches: tuple[int, ...] = (10_000, 100_000)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(fetch_records=2_000, fetch_repeats=1, e2e_records=2_000,
                   latency_records=2_000, memory_records=(2_000, 20_000),
                   definitions=(20, 50), reloads=(50,), reload_repeats=1,
                   shard_sizes=(100,), per_shard=50, shard_baseline=100, dev_sizes=(100,),
                   cli_records=2_000, cli_repeats=1, aggregator_records=2_000,
                   aggregator_repeats=1, load_sizes=(50,), load_repeats=1,
                   compression_records=2_000, list_sizes=(200,), serve_store=20_000,
                   serve_records=5_000, frames_records=20_000, frames_batches=(1_000,),
                   scale_records=2_000, store_sizes=(200_000,), removal_records=2_000,
                   removal_store=100_000, rewrites=2)


@dataclass
class Row:
    case: str
    measurement: str
    result: str
    compare: str = ""
    target: str = ""
    ok: str = ""
    values: dict[str, Any] = field(default_factory=dict)


class ChildFailed(RuntimeError):
    pass


class Bench:
    """Shared state of one run: sizes, rows, raw results, servers, logs."""

    def __init__(self, sizes: Sizes, results: Path = RESULTS,
                 echo: Callable[[str], None] = print) -> None:
        self.sizes = sizes
        self.results = results
        self.logs = results / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.rows: list[Row] = []
        self.raw: dict[str, Any] = {}
        self.echo = echo
        self._servers: dict[tuple[int, float], ServerProcess] = {}
        self._seq = 0
        self.tmp = Path(tempfile.mkdtemp(prefix="oaipmh-bench-"))

    # -- plumbing ----------------------------------------------------------------------

    def add(self, row: Row) -> None:
        self.rows.append(row)
        self.echo(f"  {row.case:>3} {row.measurement}: {row.result}"
                  + (f" | {row.compare}" if row.compare else "")
                  + (f" | target {row.target} {row.ok}" if row.target else ""))

    def child(self, kind: str, args: dict[str, Any], timeout: float = 900,
              env: dict[str, str] | None = None) -> dict[str, Any]:
        """Run one measurement in a fresh interpreter; its stderr goes to results/logs/."""
        self._seq += 1
        log = self.logs / f"{self._seq:03d}-{kind}.log"
        proc = subprocess.run([sys.executable, "-m", "benchmarks.child", kind, json.dumps(args)],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
        log.write_text(f"$ {kind} {json.dumps(args)}\n{proc.stderr}", encoding="utf-8")
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode != 0 or not lines:
            tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
            raise ChildFailed(f"{kind} failed (exit {proc.returncode}, log {log}):\n{tail}")
        return json.loads(lines[-1])

    def server(self, records: int, latency: float = 0.0) -> ServerProcess:
        key = (records, latency)
        srv = self._servers.get(key)
        if srv is None:
            t0 = time.perf_counter()
            srv = ServerProcess(records, page_size=self.sizes.page_size, latency=latency)
            srv.__enter__()
            self._servers[key] = srv
            self.echo(f"  server: {srv.records} records pre-rendered in {srv.render_seconds:.1f} s "
                      f"(ready in {time.perf_counter() - t0:.1f} s), latency {latency} s, "
                      f"{srv.url}")
        return srv

    def sqlite_url(self, name: str) -> str:
        path = self.tmp / f"{name}-{uuid.uuid4().hex[:6]}.sqlite"
        return f"sqlite:///{path}"

    def close(self) -> None:
        for srv in self._servers.values():
            srv.close()
        self._servers.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _fmt_rate(rate: float) -> str:
    return f"{rate:,.0f} rec/s"


def _fmt_bytes(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _expected_digest(records: int) -> tuple[int, str]:
    """What a complete harvest of the benchmark data set must leave in the store."""
    from oaipmh_dagster.storage.store import utc_datestamp

    items = sorted((r.identifier, [utc_datestamp(r.datestamp), r.deleted, list(r.sets)])
                   for r in dataset_for(records))
    return len(items), hashlib.sha256(json.dumps(items).encode()).hexdigest()


# -- case 1: fetch + parse ------------------------------------------------------------------

ENGINES = (("ours", "ours (OAIClient.list_records)"),
           ("ours_prefetch", "ours, prefetch=True"),
           ("sickle", "Sickle 0.7 ListRecords"),
           ("scythe", "oaipmh-scythe 0.16 list_records"))


def case_fetch(b: Bench) -> None:
    n = b.sizes.fetch_records
    srv = b.server(n)
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e, _ in ENGINES}
    for _ in range(b.sizes.fetch_repeats):  # interleaved, so load changes hit every engine
        for engine, _ in ENGINES:
            r = b.child("fetch", {"engine": engine, "url": srv.url})
            if r["records"] != srv.records:
                raise ChildFailed(f"{engine} saw {r['records']} of {srv.records} records")
            runs[engine].append(r)
    b.raw["fetch"] = {"records": n, "page_size": b.sizes.page_size, "runs": runs}
    best = {e: max(runs[e], key=lambda r: r["rate"]) for e in runs}
    best_cpu = {e: max(r["cpu_rate"] for r in runs[e]) for e in runs}
    sickle, sickle_cpu = best["sickle"]["rate"], best_cpu["sickle"]
    for engine, label in ENGINES:
        rate = best[engine]["rate"]
        row = Row("1", f"fetch+parse {n:,} rec, {label}",
                  f"{_fmt_rate(rate)} ({_fmt_rate(best_cpu[engine])} per CPU s)",
                  values={"rate": rate, "cpu_rate": best_cpu[engine],
                          "seconds": best[engine]["seconds"]})
        if engine != "sickle":
            ratio, cpu_ratio = rate / sickle, best_cpu[engine] / sickle_cpu
            row.compare = f"{ratio:.2f}x Sickle ({cpu_ratio:.2f}x per CPU s)"
            row.values.update(ratio_sickle=ratio, cpu_ratio_sickle=cpu_ratio)
            if engine == "ours":
                row.target, row.ok = ">= 2x Sickle", "ok" if ratio >= 2 else "MISS"
        b.add(row)


# -- case 2: end to end ----------------------------------------------------------------------


@contextlib.contextmanager
def postgres_database(name: str | None = None) -> Iterator[str]:
    """A fresh PostgreSQL database (dropped afterwards), named `name` or at random."""
    import sqlalchemy as sa

    name = name or f"oaipmh_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT",
                             connect_args={"connect_timeout": 5})
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        yield sa.engine.make_url(PG_ADMIN_URL).set(database=name).render_as_string(
            hide_password=False)
    finally:
        with contextlib.suppress(Exception), admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def case_e2e(b: Bench) -> None:
    n = b.sizes.e2e_records
    srv = b.server(n)
    expected = _expected_digest(n)
    results: dict[str, Any] = {}

    def check(r: dict[str, Any]) -> str:
        same = (r["stored"], r["digest"]) == expected
        return "store matches the data set" if same else (
            f"STORE DIFFERS ({r['stored']} stored, {expected[0]} expected)")

    r = b.child("harvest", {"url": srv.url, "db": b.sqlite_url("e2e")})
    results["sqlite"] = r
    b.add(Row("2", f"harvest() {n:,} rec oai_dc -> SQLite", _fmt_rate(r["rate"]),
              f"{r['seconds']:.2f} s, {_fmt_rate(r['records'] / r['cpu'])} per CPU s; "
              + check(r), ">= 5,000 rec/s", "ok" if r["rate"] >= 5000 else "MISS",
              values=r))
    try:
        with postgres_database() as url:
            r = b.child("harvest", {"url": srv.url, "db": url})
        results["postgres"] = r
        b.add(Row("2", f"harvest() {n:,} rec oai_dc -> PostgreSQL", _fmt_rate(r["rate"]),
                  f"{r['seconds']:.2f} s, {_fmt_rate(r['records'] / r['cpu'])} per CPU s "
                  "(client side); " + check(r), values=r))
    except Exception as exc:  # noqa: BLE001 - report, go on
        results["postgres"] = {"error": str(exc)}
        b.add(Row("2", "harvest() -> PostgreSQL", "n/a", f"error: {str(exc).splitlines()[0]}"))
    try:
        home = b.tmp / "job-home"
        home.mkdir(exist_ok=True)
        r = b.child("job", {"url": srv.url, "db": b.sqlite_url("job")},
                    env={"DAGSTER_HOME": str(home)})
        results["job"] = r
        b.add(Row("2", f"job execute_in_process {n:,} rec -> SQLite (reference)",
                  _fmt_rate(r["rate"]),
                  f"{r['seconds']:.2f} s run ({r['build_seconds']:.2f} s to build defs); "
                  f"success={r['success']}, {r['records']:,} stored", values=r))
    except Exception as exc:  # noqa: BLE001
        results["job"] = {"error": str(exc)}
        b.add(Row("2", "job execute_in_process", "n/a", f"error: {str(exc).splitlines()[0]}"))
    profile = b.results / "profile-e2e.txt"
    r = b.child("profile", {"url": srv.url, "db": b.sqlite_url("profile"),
                            "db2": b.sqlite_url("profile2"), "profile": str(profile)})
    results["profiled"] = r
    b.add(Row("2", "profile of harvest() -> SQLite", os.path.relpath(profile, ROOT),
              f"{_fmt_rate(r['rate'])} under pyinstrument"))
    b.raw["e2e"] = {"records": n, **results}


# -- case 3: latency bound ---------------------------------------------------------------------


def case_latency(b: Bench) -> None:
    s = b.sizes
    n, latency, k = s.latency_records, s.latency, s.windowed_parallel
    srv = b.server(n, latency)
    pages = math.ceil(srv.records / s.page_size)
    floor_seq, floor_par = pages * latency, pages * latency / k
    expected = _expected_digest(n)
    out: dict[str, Any] = {"records": n, "pages": pages, "latency": latency,
                           "floor_sequential": floor_seq, "floor_windowed": floor_par}

    def run(kind: str, args: dict[str, Any]) -> dict[str, Any]:
        srv.reset()
        r = b.child(kind, args)
        r["server"] = srv.stats()
        return r

    seq = run("harvest", {"url": srv.url, "db": b.sqlite_url("seq"), "max_parallel": 1})
    out["sequential"] = seq
    same = (seq["stored"], seq["digest"]) == expected
    b.add(Row("3", f"sequential harvest {n:,} rec, {latency * 1000:.0f} ms/request",
              f"{seq['seconds']:.1f} s",
              f"{seq['seconds'] / floor_seq:.2f}x floor {floor_seq:.1f} s; client CPU "
              f"{seq['cpu']:.1f} s; {seq['server']['list_requests']} list requests; "
              + ("store complete" if same else "STORE DIFFERS from the data set"),
              values={"seconds": seq["seconds"], "floor": floor_seq}))
    win = run("harvest", {"url": srv.url, "db": b.sqlite_url("win"), "max_parallel": k})
    out["windowed"] = win
    concurrent = win["server"]["max_concurrency"]
    if concurrent <= 1:
        b.add(Row("3", f"windowed harvest, max_parallel={k}", "n/a",
                  f"not windowed yet: the server never saw 2 list requests at once "
                  f"({win['seconds']:.1f} s, {win['server']['list_requests']} requests)",
                  values={"seconds": win["seconds"], "available": False}))
        out["windowed"]["available"] = False
    else:
        identical = (win["stored"], win["digest"]) == (seq["stored"], seq["digest"])
        b.add(Row("3", f"windowed harvest, max_parallel={k}", f"{win['seconds']:.1f} s",
                  f"{seq['seconds'] / win['seconds']:.2f}x faster than sequential; "
                  f"{win['seconds'] / floor_par:.2f}x floor {floor_par:.1f} s; client CPU "
                  f"{win['cpu']:.1f} s; peak "
                  f"{concurrent} in flight, {win['server']['list_requests']} list requests; "
                  "store " + ("identical to sequential" if identical else "DIFFERS from sequential"),
                  values={"seconds": win["seconds"], "floor": floor_par,
                          "speedup": seq["seconds"] / win["seconds"], "identical": identical,
                          "available": True}))
    sk = run("sickle_harvest", {"url": srv.url})
    out["sickle"] = sk
    b.add(Row("3", "Sickle ListRecords (sequential)", f"{sk['seconds']:.1f} s",
              f"{sk['seconds'] / floor_seq:.2f}x floor; ours sequential is "
              f"{sk['seconds'] / seq['seconds']:.2f}x as fast",
              values={"seconds": sk["seconds"]}))
    b.raw["latency"] = out


# -- case 4: memory ---------------------------------------------------------------------------


def case_memory(b: Bench) -> None:
    small, large = b.sizes.memory_records
    out: dict[str, Any] = {}
    plan = [("ours", "tracemalloc"), ("ours", "rss"), ("sickle", "rss")]
    for n in (small, large):
        srv = b.server(n)
        for engine, mode in plan:
            r = b.child("memory", {"engine": engine, "mode": mode, "url": srv.url})
            out[f"{engine}/{mode}/{n}"] = r
    for engine, mode in plan:
        a, z = out[f"{engine}/{mode}/{small}"], out[f"{engine}/{mode}/{large}"]
        growth = z["peak_bytes"] / a["peak_bytes"] if a["peak_bytes"] > 0 else float("inf")
        label = "tracemalloc peak" if mode == "tracemalloc" else "peak RSS growth"
        row = Row("4", f"fetch+parse memory, {engine}, {label}",
                  f"{_fmt_bytes(a['peak_bytes'])} @ {small:,} / "
                  f"{_fmt_bytes(z['peak_bytes'])} @ {large:,}",
                  f"{growth:.2f}x from {small:,} to {large:,}",
                  values={"small": a["peak_bytes"], "large": z["peak_bytes"], "growth": growth})
        if engine == "ours":
            row.target, row.ok = "<= 1.2x", "ok" if growth <= 1.2 else "MISS"
        b.add(row)
    b.raw["memory"] = out


# -- case 5: definitions and reload ------------------------------------------------------------

WORKSPACE_QUERY = """
{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }
"""
JOBS_QUERY = """
{ repositoriesOrError { __typename ... on RepositoryConnection { nodes { name
  jobs { name } } } } }
"""
RELOAD_MUTATION = """
mutation Reload($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) {
  __typename ... on WorkspaceLocationEntry { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } }
  ... on PythonError { message } } }
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gql(url: str, query: str, variables: dict | None = None, timeout: float = 300) -> dict:
    resp = httpx.post(url, json={"query": query, "variables": variables or {}},
                      timeout=httpx.Timeout(timeout, connect=2.0))
    resp.raise_for_status()
    body = resp.json()
    if body.get("errors"):
        raise RuntimeError(f"GraphQL errors: {body['errors']}")
    return body["data"]


def _location(url: str) -> dict[str, Any] | None:
    data = _gql(url, WORKSPACE_QUERY, timeout=30)["workspaceOrError"]
    for entry in data.get("locationEntries", []):
        if entry["name"] == LOCATION:
            return entry
    return None


def _wait_loaded(url: str, proc: subprocess.Popen, deadline: float) -> dict[str, Any]:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dagster-webserver exited with {proc.returncode}")
        try:
            entry = _location(url)
        except (httpx.HTTPError, RuntimeError, ValueError):
            entry = None
        if entry and entry["loadStatus"] == "LOADED":
            err = entry["locationOrLoadError"] or {}
            if err.get("__typename") == "PythonError":
                raise RuntimeError(f"code location failed to load: {err.get('message')}")
            return entry
        time.sleep(0.2)
    raise TimeoutError("the code location did not load in time")


def _end_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    # The code server may have left the group's leader behind: end the rest too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _reload(b: Bench, n: int) -> dict[str, Any]:
    work = b.tmp / f"reload-{n}"
    home = work / "home"
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    db_url = f"sqlite:///{work / 'registry.sqlite'}"
    filled = b.child("registry", {"db": db_url, "n": n})
    port = _free_port()
    url = f"http://127.0.0.1:{port}/graphql"
    env = {**os.environ, "DAGSTER_HOME": str(home), "OAIPMH_DATABASE_URL": db_url}
    exe = Path(sys.executable).with_name("dagster-webserver")
    log = (b.logs / f"webserver-{n}.log").open("w", encoding="utf-8")
    t0 = time.monotonic()
    proc = subprocess.Popen([str(exe), "-h", "127.0.0.1", "-p", str(port),
                             "-w", str(ROOT / "workspace.yaml")],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _wait_loaded(url, proc, t0 + 600)
        startup = time.monotonic() - t0
        nodes = _gql(url, JOBS_QUERY)["repositoriesOrError"].get("nodes", [])
        jobs = sum(1 for node in nodes for j in node["jobs"]
                   if j["name"].startswith("harvest_oaipmh_records_"))
        times = []
        for _ in range(b.sizes.reload_repeats if n < 1000 else 1):
            t1 = time.monotonic()
            res = _gql(url, RELOAD_MUTATION, {"name": LOCATION}, timeout=600)
            res = res["reloadRepositoryLocation"]
            if res.get("__typename") != "WorkspaceLocationEntry":
                raise RuntimeError(f"reload failed: {res}")
            if res.get("loadStatus") != "LOADED":
                _wait_loaded(url, proc, t1 + 600)
            times.append(time.monotonic() - t1)
        return {"n": n, "registry": filled, "startup_seconds": startup, "jobs": jobs,
                "reload_seconds": times}
    finally:
        _end_group(proc)
        log.close()


def case_definitions(b: Bench) -> None:
    out: dict[str, Any] = {"load": {}, "reload": {}}
    for n in b.sizes.definitions:
        # Three fresh processes; the median one is reported (one run is at the mercy of
        # whatever else the machine does at that second).
        runs = sorted((b.child("definitions", {"n": n}) for _ in range(3)),
                      key=lambda r: r["seconds"])
        r = runs[1]
        out["load"][n] = {**r, "runs": [x["seconds"] for x in runs]}
        times = ", ".join(f"{x['seconds']:.2f}" for x in runs)
        row = Row("5", f"definitions load, {n} harvesters", f"{r['seconds']:.2f} s",
                  f"median of {times} s: build "
                  f"{r['build_seconds']:.2f} s + validate_loadable "
                  f"{r['validate_seconds']:.2f} s (imports {r['import_seconds']:.1f} s, "
                  "not counted)", values=r)
        if n == 1000:
            row.target, row.ok = "< 3 s", "ok" if r["seconds"] < 3 else "MISS"
        b.add(row)
    for n in b.sizes.reloads:
        try:
            r = _reload(b, n)
        except Exception as exc:  # noqa: BLE001 - report, go on
            out["reload"][n] = {"error": str(exc)}
            b.add(Row("5", f"GraphQL reload, {n} harvesters", "n/a",
                      f"error: {str(exc).splitlines()[0]}"))
            continue
        out["reload"][n] = r
        b.add(Row("5", f"GraphQL reloadRepositoryLocation, {n} harvesters",
                  f"{statistics.median(r['reload_seconds']):.2f} s",
                  f"runs {', '.join(f'{t:.2f}' for t in r['reload_seconds'])} s; webserver "
                  f"start to loaded {r['startup_seconds']:.1f} s; {r['jobs']} harvest jobs "
                  "in the UI", values=r))
    b.raw["definitions"] = out


def case_shards(b: Bench) -> None:
    """Case 6 (benchmarks/shards.py, which imports this module)."""
    from benchmarks.shards import case_shards as run

    run(b)


def case_cli(b: Bench) -> None:
    """Case 7 (benchmarks/cli_e2e.py, which imports this module)."""
    from benchmarks.cli_e2e import case_cli as run

    run(b)


def case_aggregator(b: Bench) -> None:
    """Case 8 (benchmarks/aggregator.py, which imports this module)."""
    from benchmarks.aggregator import case_aggregator as run

    run(b)


def case_profiles(b: Bench) -> None:
    """Case 9 (benchmarks/profiles.py, which imports this module)."""
    from benchmarks.profiles import case_profiles as run

    run(b)


def case_sensor_footprint(b: Bench) -> None:
    """Case 10 (benchmarks/sensor_footprint.py, which imports this module)."""
    from benchmarks.sensor_footprint import case_sensor_footprint as run

    run(b)


def case_dev_add(b: Bench) -> None:
    """Case 11 (benchmarks/dev_add.py, which imports this module)."""
    from benchmarks.dev_add import case_dev_add as run

    run(b)


def case_location_load(b: Bench) -> None:
    """Case 12 (benchmarks/location_load.py, which imports this module)."""
    from benchmarks.location_load import case_location_load as run

    run(b)


def case_list_state(b: Bench) -> None:
    """Case 13 (benchmarks/list_state.py, which imports this module)."""
    from benchmarks.list_state import case_list_state as run

    run(b)


def case_compression(b: Bench) -> None:
    """Case 14 (benchmarks/compression.py, which imports this module)."""
    from benchmarks.compression import case_compression as run

    run(b)


def case_bulk_import(b: Bench) -> None:
    """Case 20 (benchmarks/bulk_import.py, which imports this module)."""
    from benchmarks.bulk_import import case_bulk_import as run

    run(b)


def case_store_scale(b: Bench) -> None:
    """Case 15 (benchmarks/store_scale.py, which imports this module)."""
    from benchmarks.store_scale import case_store_scale as run

    run(b)


def case_serve(b: Bench) -> None:
    """Case 17 (benchmarks/serve.py, which imports this module)."""
    from benchmarks.serve import case_serve as run

    run(b)


def case_downstream(b: Bench) -> None:
    """Case 18 (benchmarks/downstream.py, which imports this module)."""
    from benchmarks.downstream import case_downstream as run

    run(b)


def case_store_removal(b: Bench) -> None:
    """Case 16 (benchmarks/store_removal.py, which imports this module)."""
    from benchmarks.store_removal import case_store_removal as run

    run(b)


CASES: dict[str, tuple[str, Callable[[Bench], None]]] = {
    "1": ("fetch + parse throughput vs Sickle and oaipmh-scythe", case_fetch),
    "2": ("end-to-end harvest throughput (SQLite, PostgreSQL, job)", case_e2e),
    "3": ("latency-bound full harvest (sequential, windowed, Sickle)", case_latency),
    "4": ("peak memory of fetch + parse", case_memory),
    "5": ("definitions load and GraphQL reload", case_definitions),
    "6": ("sharded code locations", case_shards),
    "7": ("end to end through the CLI vs Sickle (SQLite, PostgreSQL)", case_cli),
    "8": ("cost of schema validation and of an XSLT crosswalk per record", case_aggregator),
    "9": ("profiles of harvest(), the job and the CLI (kept in results/profiles/)",
          case_profiles),
    "10": ("since sensor footprint: tick rows a day at 200 and 10,000 harvesters",
           case_sensor_footprint),
    "11": ("add-to-visible under dagster dev (webserver, daemon, code servers)",
           case_dev_add),
    "12": ("code location load: public builders vs the private ones they replaced",
           case_location_load),
    "13": ("harvester list and since resolution at 1,000 and 10,000 harvesters",
           case_list_state),
    "14": ("record bytes on PostgreSQL: the defaults vs lz4 (migration 0009)",
           case_compression),
    "17": ("OAI-PMH data provider: records per second served to Sickle from 1,000,000",
           case_serve),
    "20": ("harvester import: endpoints probed by a pool vs one at a time",
           case_bulk_import),
    "18": ("downstream asset input at 1,000,000 records: whole DataFrame vs batches",
           case_downstream),
    "15": ("a harvester's costs as the PostgreSQL store grows (partitions, 0010)",
           case_store_scale),
    "16": ("removal, and size after full re-harvests, of one harvester (PostgreSQL)",
           case_store_removal),
}


def rows_as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
