"""One measurement per process: `python -m benchmarks.child <kind> '<json args>'`.

Each measurement runs in a fresh interpreter (imports, engines, caches and memory
start clean) and prints one JSON object on its last stdout line. Import time is
measured separately from the timed section and never counted in throughput.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# -- fetch + parse ---------------------------------------------------------------------


def _records(engine: str, url: str, prefix: str) -> tuple[Iterator[Any], Callable[[], None]]:
    """(records, close) of one client over a full ListRecords list."""
    if engine in ("ours", "ours_prefetch"):
        from oaipmh_dagster.oai import ClientOptions, OAIClient

        client = OAIClient(url, ClientOptions(prefetch=engine == "ours_prefetch", max_retries=0))
        return client.list_records(prefix), client.close
    if engine == "sickle":
        from sickle import Sickle

        return Sickle(url).ListRecords(metadataPrefix=prefix, ignore_deleted=False), lambda: None
    if engine == "scythe":
        from oaipmh_scythe import Scythe

        scythe = Scythe(url)
        return scythe.list_records(metadata_prefix=prefix, ignore_deleted=False), scythe.close
    raise ValueError(f"unknown engine {engine!r}")


def _touch(engine: str, records: Iterator[Any]) -> tuple[int, int]:
    """Iterate every record, reading identifier, datestamp and metadata (the bytes of the
    metadata element for ours, the dict the peers build eagerly). Returns (records,
    size of what was touched)."""
    n = size = 0
    if engine.startswith("ours"):
        for rec in records:
            h = rec.header
            size += len(h.identifier) + len(h.datestamp)
            meta = rec.metadata
            if meta is not None:
                size += len(meta)
            n += 1
    else:
        for rec in records:
            h = rec.header
            size += len(h.identifier) + len(h.datestamp)
            meta = getattr(rec, "metadata", None)
            if meta:
                size += len(meta)
            n += 1
    return n, size


def fetch(args: dict[str, Any]) -> dict[str, Any]:
    engine = args["engine"]
    t0 = time.perf_counter()
    records, close = _records(engine, args["url"], args.get("prefix", "oai_dc"))
    imported = time.perf_counter() - t0
    c0, t0 = _cpu(), time.perf_counter()
    n, size = _touch(engine, records)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    close()
    return {"engine": engine, "records": n, "touched": size, "seconds": wall, "cpu": cpu,
            "rate": n / wall, "cpu_rate": n / cpu if cpu else 0.0, "import_seconds": imported}


def _vm_kib(name: str) -> int:
    """A `Vm...` line of /proc/self/status, in KiB (0 where unavailable)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM, ru_maxrss) to the current RSS (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def memory(args: dict[str, Any]) -> dict[str, Any]:
    """Peak memory of fetch + parse after imports and client set-up: the peak RSS growth
    over the RSS at the start (the peak mark reset there), or the tracemalloc peak."""
    engine, mode = args["engine"], args["mode"]
    records, close = _records(engine, args["url"], args.get("prefix", "oai_dc"))
    out: dict[str, Any] = {"engine": engine, "mode": mode}
    if mode == "tracemalloc":
        import tracemalloc

        tracemalloc.start()
    else:
        import gc

        gc.collect()
        out["peak_reset"] = _reset_peak_rss()
        out["rss_base_kib"] = _vm_kib("VmRSS") if out["peak_reset"] else _rss_kib()
    t0 = time.perf_counter()
    out["records"], _ = _touch(engine, records)
    out["seconds"] = time.perf_counter() - t0
    if mode == "tracemalloc":
        import tracemalloc

        out["peak_bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    else:
        out["rss_peak_kib"] = _vm_kib("VmHWM") or _rss_kib()
        out["peak_bytes"] = max(0, out["rss_peak_kib"] - out["rss_base_kib"]) * 1024
    close()
    return out


# -- harvest into a store ----------------------------------------------------------------


def _snapshot_digest(store: Any, harvester_id: str) -> tuple[int, str]:
    snap = store.snapshot(harvester_id)
    text = json.dumps(sorted((k, list(v[:2]) + [list(v[2])]) for k, v in snap.items()))
    return len(snap), hashlib.sha256(text.encode()).hexdigest()


def stored(args: dict[str, Any]) -> dict[str, Any]:
    """How many records of a harvester the store holds, and their digest."""
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.store import Store

    engine = db.get_engine(args["db"], migrate=False)
    n, digest = _snapshot_digest(Store(engine), args["id"])
    engine.dispose()
    return {"stored": n, "digest": digest}


def _harvester(args: dict[str, Any]) -> Any:
    from oaipmh_dagster.storage.registry import Harvester

    extra = {k: args[k] for k in ("transformer", "schema") if args.get(k)}
    return Harvester(id=args.get("id", "bench"), base_url=args["url"],
                     metadata_prefix=args.get("prefix", "oai_dc"),
                     max_parallel=int(args.get("max_parallel", 1)), max_retries=2, timeout=60,
                     **extra)


def harvest(args: dict[str, Any]) -> dict[str, Any]:
    """`harvest()` of one harvester into a fresh store (fetch + parse + store + transform)."""
    from oaipmh_dagster.harvesting.harvest import harvest as run_harvest
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.store import Store

    engine = db.get_engine(args["db"])
    store = Store(engine)
    h = _harvester(args)
    c0, t0 = _cpu(), time.perf_counter()
    stats = run_harvest(h, store, run_id=uuid.uuid4().hex)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    out: dict[str, Any] = {"records": stats.records, "seconds": wall, "cpu": cpu,
                           "rate": stats.records / wall, "requests": stats.requests,
                           "pages": stats.pages, "failed": stats.failed, "mode": stats.mode}
    out["stored"], out["digest"] = _snapshot_digest(store, h.id)
    engine.dispose()
    return out


def profile(args: dict[str, Any]) -> dict[str, Any]:
    """Profile `harvest()` end to end, with page prefetching off so that fetch, parse,
    store and transform all run on the profiled thread: pyinstrument (wall clock, call
    tree) into one fresh store, then cProfile timed by this thread's CPU clock (robust
    to a busy machine) into another."""
    import cProfile
    import io
    import pstats

    from pyinstrument import Profiler
    from pyinstrument.renderers import ConsoleRenderer

    from oaipmh_dagster.harvesting.harvest import client_options
    from oaipmh_dagster.harvesting.harvest import harvest as run_harvest
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.store import Store

    h = _harvester(args)
    options = client_options(h, prefetch=False)
    sections = []
    engine = db.get_engine(args["db"])
    profiler = Profiler(interval=0.0005)
    profiler.start()
    t0 = time.perf_counter()
    stats = run_harvest(h, Store(engine), run_id=uuid.uuid4().hex, options=options)
    wall = time.perf_counter() - t0
    profiler.stop()
    engine.dispose()
    flat = ConsoleRenderer(flat=True, time="percent_of_total", unicode=False, color=False
                           ).render(profiler.last_session)
    tree = ConsoleRenderer(time="percent_of_total", unicode=False, color=False,
                           processor_options={"filter_threshold": 0.01}
                           ).render(profiler.last_session)
    sections.append(f"== pyinstrument, wall clock: {stats.records} records in {wall:.2f} s "
                    f"({stats.records / wall:.0f} records/s under the profiler) ==\n"
                    "-- self time by function --\n" + "\n".join(flat.splitlines()[:60]))
    sections.append("-- call tree (frames >= 1%) --\n" + tree)

    engine = db.get_engine(args["db2"])
    prof = cProfile.Profile(time.thread_time)
    t0 = time.perf_counter()
    prof.enable()
    stats = run_harvest(h, Store(engine), run_id=uuid.uuid4().hex, options=options)
    prof.disable()
    wall2 = time.perf_counter() - t0
    engine.dispose()
    for order in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(order).print_stats(45)
        sections.append(f"== cProfile, this thread's CPU time, sorted by {order}: "
                        f"{stats.records} records in {wall2:.2f} s wall ==\n" + buf.getvalue())
    head = (f"Profile of harvest() end to end (fetch + parse + store + transform) into "
            f"{args['db'].split(':')[0]}, pre-rendered pages from {args['url']}.\n"
            "The benchmark server runs in another process; prefetch is off here, so waiting "
            "for it shows up as socket reads.\n\n")
    with open(args["profile"], "w", encoding="utf-8") as fh:
        fh.write(head + "\n\n".join(sections))
    return {"records": stats.records, "seconds": wall, "rate": stats.records / wall,
            "cprofile_seconds": wall2}


def profile_job(args: dict[str, Any]) -> dict[str, Any]:
    """pyinstrument over the harvester's job through `execute_in_process` (a temporary
    instance under $DAGSTER_HOME), definitions built before the profile starts."""
    os.environ["OAIPMH_DATABASE_URL"] = args["db"]
    import dagster as dg
    from pyinstrument import Profiler
    from pyinstrument.renderers import ConsoleRenderer

    from oaipmh_dagster.definitions import build_definitions
    from oaipmh_dagster.defs.assets import op_name
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import Harvester, Registry
    from oaipmh_dagster.storage.store import Store

    engine = db.get_engine(args["db"])
    h = Registry(engine).add(Harvester(id="profile_job", base_url=args["url"],
                                       metadata_prefix=args.get("prefix", "oai_dc")))
    job_def = build_definitions([h], "oaipmh_dagster").resolve_job_def(h.job_name)
    with dg.instance_for_test() as instance:
        profiler = Profiler(interval=0.0005)
        profiler.start()
        t0 = time.perf_counter()
        result = job_def.execute_in_process(
            run_config={"ops": {op_name(h.id): {"config": {}}}}, instance=instance,
            raise_on_error=False)
        wall = time.perf_counter() - t0
        profiler.stop()
    stored = Store(engine).count(h.id, live_only=False)
    flat = ConsoleRenderer(flat=True, time="percent_of_total", unicode=False, color=False
                           ).render(profiler.last_session)
    tree = ConsoleRenderer(time="percent_of_total", unicode=False, color=False,
                           processor_options={"filter_threshold": 0.01}
                           ).render(profiler.last_session)
    with open(args["profile"], "w", encoding="utf-8") as fh:
        fh.write(f"Profile of the harvester's job through execute_in_process (SQLite store, "
                 f"temporary instance), main thread, wall clock: {stored} records in "
                 f"{wall:.2f} s, success={result.success}.\n\n-- self time by function --\n"
                 + "\n".join(flat.splitlines()[:60])
                 + "\n\n-- call tree (frames >= 1%) --\n" + tree)
    return {"success": result.success, "records": stored, "seconds": wall}


def job(args: dict[str, Any]) -> dict[str, Any]:
    """The harvester's Dagster job through `execute_in_process` (ephemeral instance)."""
    os.environ["OAIPMH_DATABASE_URL"] = args["db"]
    t0 = time.perf_counter()
    import dagster as dg

    from oaipmh_dagster.definitions import build_definitions
    from oaipmh_dagster.defs.assets import op_name
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import Harvester, Registry
    from oaipmh_dagster.storage.store import Store

    imported = time.perf_counter() - t0
    engine = db.get_engine(args["db"])
    h = Registry(engine).add(Harvester(id="bench_job", base_url=args["url"],
                                       metadata_prefix=args.get("prefix", "oai_dc")))
    t0 = time.perf_counter()
    job_def = build_definitions([h], "oaipmh_dagster").resolve_job_def(h.job_name)
    built = time.perf_counter() - t0
    with dg.instance_for_test() as instance:
        c0, t0 = _cpu(), time.perf_counter()
        result = job_def.execute_in_process(
            run_config={"ops": {op_name(h.id): {"config": {}}}}, instance=instance,
            raise_on_error=False)
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
    stored = Store(engine).count(h.id, live_only=False)
    return {"success": result.success, "records": stored, "seconds": wall, "cpu": cpu,
            "rate": stored / wall, "build_seconds": built, "import_seconds": imported}


# -- latency bound: Sickle over the latency server ----------------------------------------


def sickle_harvest(args: dict[str, Any]) -> dict[str, Any]:
    records, close = _records("sickle", args["url"], args.get("prefix", "oai_dc"))
    t0, c0 = time.perf_counter(), _cpu()
    n, _ = _touch("sickle", records)
    return {"records": n, "seconds": time.perf_counter() - t0, "cpu": _cpu() - c0}


# -- definitions ---------------------------------------------------------------------------


def harvesters(n: int, url: str = "http://127.0.0.1:9/oai",
               hour: int | None = None) -> list[Any]:
    """N harvesters with daily crons spread over the day, or all in `hour` (a bench that
    runs a scheduler daemon keeps every tick out of its measurement)."""
    from oaipmh_dagster.storage.registry import Harvester

    sets = ("publications", "datasets", "theses")
    return [Harvester(id=f"bench_{i:04d}", base_url=f"{url}{i % 37}", metadata_prefix="oai_dc",
                      sets=sets[: i % 3],
                      cron=f"{i % 60} {i % 24 if hour is None else hour} * * *")
            for i in range(n)]


def definitions(args: dict[str, Any]) -> dict[str, Any]:
    """Import, build and validate the code location's Definitions for N harvesters."""
    t0 = time.perf_counter()
    import dagster as dg

    from oaipmh_dagster.definitions import build_definitions, freeze_long_lived

    imported = time.perf_counter() - t0
    rows = harvesters(int(args["n"]))
    t0 = time.perf_counter()
    freeze_long_lived()  # as the code location's entry point does
    defs = build_definitions(rows, "oaipmh_dagster")
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    dg.Definitions.validate_loadable(defs)
    validated = time.perf_counter() - t0
    return {"n": len(rows), "import_seconds": imported, "build_seconds": built,
            "validate_seconds": validated, "seconds": built + validated}


def location_load(args: dict[str, Any]) -> dict[str, Any]:
    """What a code server does to load the location of N harvesters, built through
    `path` (`benchmarks.load_paths`): build the Definitions, resolve the repository and
    its jobs, serialize the repository snapshot it sends (job snapshots deferred). Wall
    and CPU seconds, imports not counted; the snapshot's digest and one job's snapshot
    id tell whether two paths give the same location."""
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster_shared.serdes import serialize_value

    from benchmarks.load_paths import use
    from oaipmh_dagster.definitions import build_definitions, freeze_long_lived

    path = args.get("path", "public")
    use(path)
    rows = harvesters(int(args["n"]))
    freeze_long_lived()  # as the code location's entry point does
    c0, t0 = _cpu(), time.perf_counter()
    defs = build_definitions(rows, "oaipmh_dagster")
    c1 = _cpu()
    repo = defs.get_repository_def()
    repo.load_all_definitions()
    c2 = _cpu()
    data = serialize_value(RepositorySnap.from_def(repo, defer_snapshots=True))
    c3, t3 = _cpu(), time.perf_counter()
    job = repo.get_job(rows[0].job_name) if rows else None
    return {"n": len(rows), "path": path, "jobs": len(repo.get_all_jobs()),
            "snapshot_bytes": len(data.encode()),
            "snapshot_sha256": hashlib.sha256(data.encode()).hexdigest(),
            "job_snapshot_id": job.get_job_snapshot_id() if job is not None else None,
            "seconds": t3 - t0, "cpu_seconds": c3 - c0,
            "build_cpu": c1 - c0, "resolve_cpu": c2 - c1, "snapshot_cpu": c3 - c2}


def registry(args: dict[str, Any]) -> dict[str, Any]:
    """Fill a registry database with N harvesters (for the reload case)."""
    import sqlalchemy as sa

    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import harvester_table

    engine = db.get_engine(args["db"])
    rows = harvesters(int(args["n"]), hour=args.get("hour"))
    from oaipmh_dagster.storage.registry import Registry

    t0 = time.perf_counter()
    reg = Registry(engine)
    for h in rows:
        reg.add(h)
    with engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(harvester_table)).scalar()
    return {"n": count, "seconds": time.perf_counter() - t0}


# -- sharded code locations ------------------------------------------------------------------


def shard_snapshot(args: dict[str, Any]) -> dict[str, Any]:
    """The repository snapshot one shard's code server sends (job snapshots deferred):
    its serialized size and CPU time, and the size of one job snapshot."""
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._core.snap import JobSnap
    from dagster_shared.serdes import serialize_value

    from oaipmh_dagster.definitions import build_definitions, freeze_long_lived
    from oaipmh_dagster.operations.shards import DEFAULT_LOCATION, Shard

    n, k, index = int(args["n"]), int(args["k"]), int(args.get("index", 0))
    shard = Shard(index, k)
    rows = [h for h in harvesters(n) if shard.holds(h.id)]
    freeze_long_lived()
    repo_def = build_definitions(rows, shard.location_name() if k > 1 else DEFAULT_LOCATION
                                 ).get_repository_def()
    repo_def.get_all_jobs()  # build the jobs outside the timed section
    c0, t0 = _cpu(), time.perf_counter()
    data = serialize_value(RepositorySnap.from_def(repo_def, defer_snapshots=True))
    cpu, wall = _cpu() - c0, time.perf_counter() - t0
    job_def = repo_def.get_job(rows[0].job_name)
    c0 = _cpu()
    job_data = serialize_value(JobSnap.from_job_def(job_def))
    job_cpu = _cpu() - c0
    jobs = len(repo_def.get_all_jobs())
    return {"harvesters": len(rows), "jobs": jobs, "bytes": len(data.encode()),
            "cpu_seconds": cpu, "seconds": wall, "per_job_ms": cpu / max(1, jobs) * 1000,
            "job_bytes": len(job_data.encode()), "job_cpu_seconds": job_cpu}


def _iteration(context: Any, iteration_times: dict[str, Any]) -> dict[str, Any]:
    import logging

    from dagster._scheduler.scheduler import launch_scheduled_runs
    from dagster._time import get_current_datetime

    logger = logging.getLogger("benchmarks.scheduler")
    c0, t0 = _cpu(), time.perf_counter()
    errors = [x for x in launch_scheduled_runs(context, logger, get_current_datetime(),
                                               iteration_times) if x is not None]
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"seconds": wall, "cpu": cpu, "errors": len(errors),
            "runs_after": context.instance.get_runs_count()}


def scheduler(args: dict[str, Any]) -> dict[str, Any]:
    """One iteration of Dagster's scheduler daemon (`launch_scheduled_runs`, no threads:
    the default) over a workspace of K locations, $DAGSTER_HOME a fresh instance. Enabled
    harvesters' schedules are RUNNING by default (declared in code): the first iteration
    stores their states; the second is a daemon restart's (every schedule's ticks and
    checkpoint looked up); the third keeps the second's in-memory iteration times, as a
    running daemon does every 30 s."""
    from dagster import DagsterInstance

    instance = DagsterInstance.get()
    # The code servers inherit stdout: send it to stderr, which keeps the result line last.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        return _scheduler(args, instance)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _scheduler(args: dict[str, Any], instance: Any) -> dict[str, Any]:
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    t0 = time.perf_counter()
    target = WorkspaceFileTarget(paths=[args["workspace"]])
    with WorkspaceProcessContext(instance, target) as context:
        entries = context.create_request_context().get_code_location_entries()
        load = time.perf_counter() - t0
        failed = [n for n, e in entries.items() if e.code_location is None]
        if failed:
            raise RuntimeError(f"locations failed to load: {failed}")
        schedules = [s for e in entries.values() if e.code_location
                     for repo in e.code_location.get_repositories().values()
                     for s in repo.get_schedules()]
        running = sum(1 for s in schedules if s.get_current_instigator_state(None).is_running)
        first = _iteration(context, {})
        times: dict[str, Any] = {}
        restart = _iteration(context, times)
        steady = _iteration(context, times)
        runs = instance.get_runs_count()
    instance.dispose()
    return {"locations": len(entries), "schedules": len(schedules), "running": running,
            "load_seconds": load, "iterations": [first, restart, steady], "runs": runs}


def list_fill(args: dict[str, Any]) -> dict[str, Any]:
    """Case 13's instance and registry of N harvesters (`benchmarks.list_fill`)."""
    from benchmarks.list_state import fill_child

    return fill_child(args)


def frames(args: dict[str, Any]) -> dict[str, Any]:
    """Case 18's reading of a store as DataFrames (`benchmarks.downstream`)."""
    from benchmarks.downstream import frames_child

    return frames_child(args)


KINDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "fetch": fetch, "memory": memory, "harvest": harvest, "profile": profile, "job": job,
    "profile_job": profile_job,
    "sickle_harvest": sickle_harvest, "definitions": definitions, "registry": registry,
    "location_load": location_load,
    "stored": stored,
    "shard_snapshot": shard_snapshot, "scheduler": scheduler, "list_fill": list_fill,
    "frames": frames,
}


def main() -> int:
    kind, raw = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "{}"
    result = KINDS[kind](json.loads(raw))
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
