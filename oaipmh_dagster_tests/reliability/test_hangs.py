"""Harvests that would hang: a server that trickles a page for ever, and Ctrl-C, SIGTERM
or a cancel from the UI while a page is in flight. SQLite and PostgreSQL.

Each ends promptly (a generous bound: the stall would last ten minutes), with the harvest state `failed` and its checkpoint kept, and
the next harvest completes the data set from that checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.harvesting.harvest import harvest
from oaipmh_dagster.oai import ClientOptions, OAITransportError
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.conftest import REPO_ROOT
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer
from oaipmh_dagster_tests.reliability.conftest import FAST, PAGE, RECORDS, assert_consistent
from oaipmh_dagster_tests.reliability.conftest import harvester as _h

# Seconds from the signal to the process's exit: about 1-3 s on a quiet machine; the bound
# leaves room for a loaded one, far below the ten-minute stall that a hang would wait for.
STOP_WITHIN = 60.0
STALLED_PAGE = 3


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str,
              proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the process ended ({proc.returncode}) before {what}:\n{out}")
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _page_in_flight(server: OAIServer) -> bool:
    return any(r.page == STALLED_PAGE and r.finished is None for r in server.requests)


def _committed(harvester_id: str, pages: int = STALLED_PAGE - 1) -> Callable[[], bool]:
    """Whether the harvest has committed `pages` pages (its checkpoint says so): the page
    before the stalled one may still be on its way to the store when that one is asked for."""
    store = Store()

    def done() -> bool:
        state = store.state(harvester_id)
        return bool(state and state["checkpoint"] and state["checkpoint"].get("pages") == pages)

    return done


def _stop(proc: subprocess.Popen, sig: int) -> tuple[float, str]:
    """Send `sig`; (seconds until the process exited, its output). Kills it after
    STOP_WITHIN + 20 s so a regression fails instead of hanging the suite."""
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(STOP_WITHIN + 20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    elapsed = time.monotonic() - sent
    out = proc.stdout.read() if proc.stdout else ""
    proc.stdout.close()
    return elapsed, out


def _failed_with_checkpoint(store: Store, server: OAIServer, harvester_id: str,
                            pages: int = STALLED_PAGE - 1) -> None:
    state = store.state(harvester_id)
    assert state["status"] == "failed", state["status"]
    assert state["checkpoint"]["token"] and state["checkpoint"]["pages"] == pages
    snap = assert_consistent(store, harvester_id, expected_snapshot(server.dataset))
    assert len(snap) == pages * PAGE


def _env(database_url: str) -> dict[str, str]:
    return {**os.environ, "OAIPMH_DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}


def _cli(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("oaipmh-dagster")), *args]


# -- a page that trickles for ever -----------------------------------------------------


def test_trickling_page_fails_after_retries_then_resumes(database_url: str,
                                                         server: OAIServer) -> None:
    """Page 3 comes one byte every 0.3 s, for ever (no read comes near the 5 s read
    timeout): each attempt is given up at the 2 s request deadline, never before,
    retried, and the harvest fails with a OAITransportError saying what arrived; pages 1-2
    and their checkpoint are kept, and the next harvest resumes and completes."""
    server.faults.add("trickle", verb="ListRecords", page=STALLED_PAGE, times=None,
                      interval=0.3)
    store = Store()
    h = _h(server)
    options = ClientOptions(max_retries=2, backoff_base=0.01, backoff_max=0.05, read_timeout=5,
                            request_timeout=2)
    started = time.monotonic()
    with pytest.raises(OAITransportError, match="did not finish the response") as info:
        harvest(h, store, run_id="trickled", options=options)
    assert 3 * 2 <= time.monotonic() - started < STOP_WITHIN
    assert "within the request deadline of 2 s; gave up after 3 attempts" in str(info.value)
    assert info.value.token  # says where: the page's resumption token
    _failed_with_checkpoint(store, server, h.id)

    server.faults.clear()
    server.clear_log()
    stats = harvest(h, store, run_id="next", options=FAST)
    assert stats.mode == "resumed"
    assert store.snapshot(h.id) == expected_snapshot(server.dataset)
    assert store.count(h.id, live_only=False) == RECORDS


# -- oaipmh-dagster harvest, stopped by a signal ----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_harvest_stops_on_signal_with_a_page_in_flight(
    database_url: str, server: OAIServer, sig: int
) -> None:
    """`oaipmh-dagster harvest` waits for page 3 from a server that stalls for ten
    minutes (while page 4 would be prefetched); SIGINT or SIGTERM ends it within
    seconds: exit 1, one error line saying the run was interrupted, state `failed` with
    the checkpoint after page 2; the next `harvest` completes the data set."""
    add_harvester("hang", server.base_url)
    server.faults.add("delay", verb="ListRecords", page=STALLED_PAGE, times=None, seconds=600)
    proc = subprocess.Popen(_cli("harvest", "hang"), env=_env(database_url), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: _page_in_flight(server), 120, "page 3 to be requested", proc)
        _wait_for(_committed("hang"), 120, "page 2 to be committed", proc)
        elapsed, out = _stop(proc, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert elapsed < STOP_WITHIN, f"exited {elapsed:.1f} s after {sig.name}:\n{out}"
    assert proc.returncode == 1, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("oaipmh-dagster: error: run ") and "interrupted" in last, out
    store = Store()
    _failed_with_checkpoint(store, server, "hang")
    with dg.DagsterInstance.get() as instance:
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.FAILURE

    server.faults.clear()
    done = subprocess.run(_cli("harvest", "hang"), env=_env(database_url), text=True,
                          capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert store.snapshot("hang") == expected_snapshot(server.dataset)
    assert store.state("hang")["status"] == "succeeded"


# -- the Dagster run worker, terminated ---------------------------------------------------


def _launch_run_worker(database_url: str, harvester_id: str) -> tuple[subprocess.Popen, str]:
    """Create a run of the harvester's job and start the process Dagster's run launchers
    start for it (`dagster api execute_run`, as in a Kubernetes or Docker run worker)."""
    from dagster._core.definitions.reconstruct import ReconstructableRepository
    from dagster._grpc.types import ExecuteRunArgs
    from dagster._serdes import serialize_value

    from oaipmh_dagster.definitions import build_definitions
    from oaipmh_dagster.storage.registry import Registry

    job_name = f"harvest_oaipmh_records_{harvester_id}"
    repo = ReconstructableRepository.for_module("oaipmh_dagster.definitions", "defs",
                                                working_directory=str(REPO_ROOT))
    origin = repo.get_reconstructable_job(job_name).get_python_origin()
    job = build_definitions([Registry().get(harvester_id)]).resolve_job_def(job_name)
    with dg.DagsterInstance.get() as instance:
        run = instance.create_run_for_job(job_def=job, job_code_origin=origin)
        args = ExecuteRunArgs(job_origin=origin, run_id=run.run_id,
                              instance_ref=instance.get_ref(), set_exit_code_on_failure=True)
    exe = Path(sys.executable).with_name("dagster")
    proc = subprocess.Popen([str(exe), "api", "execute_run", serialize_value(args)],
                            env=_env(database_url), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    return proc, run.run_id


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "canceled"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["SIGTERM", "terminate-from-UI"],
)
def test_run_worker_stops_with_a_page_in_flight(
    database_url: str, server: OAIServer, sig: int, canceled: bool
) -> None:
    """A run worker waits for page 3 from a server that trickles it for ever. SIGTERM
    (what Kubernetes or Docker send when a run is terminated) or the UI's terminate
    (the run marked CANCELING, then SIGINT to the worker, as the code server does) ends
    the worker within seconds; the run is FAILURE or CANCELED, never left STARTED, the
    state row `failed` with its checkpoint, and the next harvest completes."""
    add_harvester("worker", server.base_url)
    server.faults.add("trickle", verb="ListRecords", page=STALLED_PAGE, times=None,
                      interval=1.0)
    proc, run_id = _launch_run_worker(database_url, "worker")
    try:
        _wait_for(lambda: _page_in_flight(server), 120, "page 3 to be requested", proc)
        _wait_for(_committed("worker"), 120, "page 2 to be committed", proc)
        if canceled:
            with dg.DagsterInstance.get() as instance:
                instance.report_run_canceling(instance.get_run_by_id(run_id))
        elapsed, out = _stop(proc, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert elapsed < STOP_WITHIN, f"exited {elapsed:.1f} s after {sig.name}:\n{out}"
    with dg.DagsterInstance.get() as instance:
        status = instance.get_run_by_id(run_id).status
    expected = dg.DagsterRunStatus.CANCELED if canceled else dg.DagsterRunStatus.FAILURE
    assert status == expected, out
    store = Store()
    _failed_with_checkpoint(store, server, "worker")

    server.faults.clear()
    stats = harvest(_h(server, id="worker"), store, run_id="next", options=FAST)
    assert stats.mode == "resumed"
    assert store.snapshot("worker") == expected_snapshot(server.dataset)


# -- a windowed parallel harvest, interrupted ----------------------------------------------

WINDOWED_CHILD = textwrap.dedent("""
    import sys
    from oaipmh_dagster.harvesting.harvest import harvest
    from oaipmh_dagster.storage.registry import Harvester
    from oaipmh_dagster.storage.store import Store

    h = Harvester(id="windows", base_url=sys.argv[1], metadata_prefix="oai_dc",
                  max_parallel=3)
    try:
        harvest(h, Store(), run_id="interrupted")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(1)
""")


def _sigint_acts() -> None:
    """In the child: SIGINT acts (a Ctrl-C), even when this pytest was started from a
    background shell that ignores SIGINT: Python leaves an inherited ignore in place, so
    the harvest would never see the KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def big_server() -> Iterator[OAIServer]:
    """3000 records in pages of 100: a list long enough to be cut into windows."""
    with OAIServer(make_dataset(3000, seed=17, deleted_ratio=0.05), page_size=PAGE) as srv:
        yield srv


def test_windowed_harvest_stops_on_sigint(database_url: str, big_server: OAIServer) -> None:
    """Three workers page through date windows; every window's second page stalls for
    ten minutes. Ctrl-C ends the harvest within seconds (the workers' requests are cut,
    not awaited), the state is `failed` with the windows' checkpoint, and the next run
    resumes the unfinished windows and completes."""
    server = big_server
    store = Store()  # creates the schema before the child starts
    server.faults.add("delay", verb="ListRecords", page=2, times=None, seconds=600)
    proc = subprocess.Popen([sys.executable, "-c", WINDOWED_CHILD, server.base_url],
                            env=_env(database_url), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=_sigint_acts)
    try:
        _wait_for(lambda: sum(r.page == 2 and r.finished is None for r in server.requests) >= 3,
                  120, "three stalled requests", proc)
        _wait_for(lambda: (store.state("windows") or {}).get("checkpoint") is not None, 120,
                  "the windows' checkpoint", proc)
        elapsed, out = _stop(proc, signal.SIGINT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert elapsed < STOP_WITHIN, f"exited {elapsed:.1f} s after SIGINT:\n{out}"
    assert proc.returncode == 1 and out.strip().endswith("interrupted"), out
    state = store.state("windows")
    assert state["status"] == "failed" and state["checkpoint"]["mode"] == "windowed"
    assert_consistent(store, "windows", expected_snapshot(server.dataset))

    server.faults.clear()
    stats = harvest(_h(server, id="windows", max_parallel=3), store, run_id="next",
                    options=FAST)
    assert stats.mode == "resumed"
    assert store.snapshot("windows") == expected_snapshot(server.dataset)
