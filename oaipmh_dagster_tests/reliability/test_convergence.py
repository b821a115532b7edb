"""Randomized multi-round convergence: a harvester's store follows a changing server.

Per seed, a loopback server's data set changes between rounds (records added, changed,
deleted, resurrected, moved between sets; the server clock advances, some changes are
stamped up to the overlap before the previous round's clock), the harvester's sets
sometimes change, and rounds fail on purpose: a server fault with no retries (HTTP 500,
a connection reset, a truncated page, a refused token), tokens expired before a resume,
or a harvest process killed with SIGKILL mid-list. Each round runs the harvester's job
in-process on one Dagster instance and ticks the since sensor. Then:

- a failed round leaves the state `failed` (with a checkpoint once a page of its list
  was stored) and since where it was; a killed one leaves the dead process's lease and
  since where it was; either way the store holds only versions the server served;
- a refused token mid-list restarts the list once (the client's rule), so that fault
  alone may end in success; no other fault may (the harvester has no retries);
- a successful round that read fresh lists leaves the store equal to the server for the
  harvester's selection (identifiers, deleted flags, UTC datestamps, sets and the
  metadata revision), and since at the server's clock of that round;
- a successful round that resumed an interrupted list leaves since at that list's start;
  the store equals the server for every record unchanged since that start and holds
  only versions the server served for the others (a resumed list cannot show what
  changed behind its position, or after its snapshot: the next round asks from its
  start and converges).

The profile and every round are in the failure message: `seed` reproduces them.
`make test` plays seeds 0-3 (every pair of granularity, snapshot lists and windowing);
the soak set (`make soak`) plays seeds 4-7 (with them, every combination) and 24 more
seeds of 20 rounds. SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

import dagster as dg
import pytest

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs import sensors
from oaipmh_dagster.defs.assets import asset_keys, op_name
from oaipmh_dagster.defs.since import current_state, resolve_since
from oaipmh_dagster.harvesting.worker import WORKER_ENV
from oaipmh_dagster.oai import format_datestamp, parse_user_datetime
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer
from oaipmh_dagster_tests.oaiserver import RequestInfo
from oaipmh_dagster_tests.reliability.convergence import (
    SELECTIONS,
    Profile,
    World,
    differences,
    profile,
    stored,
)

LOCATION = "oaipmh_dagster"
HID = "conv"
SEEDS = range(4)
ROUNDS = 5
# (seed, rounds): the other half of the eight combinations, then the long variant.
SOAK_PLAYS = ([(seed, ROUNDS) for seed in range(4, 8)]
              + [(seed, 20) for seed in range(100, 124)])
PAGE_SIZES = (5, 9, 16)
FAULT_PAGE_SIZES = (2, 3, 4)
KILL_PAGE_SIZES = (1, 1, 2)
FULL_PAGE_SIZES = (16, 25, 40)
FAULTS = ("status", "reset", "truncate", "bad_token")

CHILD = textwrap.dedent("""
    import sys
    from oaipmh_dagster.harvesting.harvest import RunOptions, harvest
    from oaipmh_dagster.storage.registry import Registry
    from oaipmh_dagster.storage.store import Store

    hid, run_id, since, overlap = sys.argv[1:5]
    run = RunOptions(since=since or None, full=not since, overlap=overlap == "1")
    harvest(Registry().get(hid), Store(), run, run_id=run_id)
""")


def from_nth_list_request(n: int) -> Callable[[RequestInfo], bool]:
    """A fault predicate true from the `n`-th ListRecords request on (whichever list or
    window it belongs to)."""
    seen = [0]

    def when(info: RequestInfo) -> bool:
        seen[0] += 1
        return seen[0] >= n

    return when


@dataclass(frozen=True)
class Plan:
    """What happens in one round, drawn in full before it starts, so that a seed plays
    the same rounds whatever the timing of the last one did."""

    changes: int
    new_sets: tuple[str, ...] | None
    expire_tokens: bool
    action: str
    size: int  # index into the page size choices
    nth: int  # the faulted ListRecords request
    pause: float  # seconds between the delayed request and the kill

    @classmethod
    def draw(cls, rng: random.Random, sets: tuple[str, ...], *, clean: bool) -> Plan:
        changes = rng.randint(0, 10)
        change_sets = rng.random() < 0.15
        other = [s for s in SELECTIONS if s != sets][rng.randrange(len(SELECTIONS) - 1)]
        expire = rng.random() < 0.25
        action = rng.choices(("clean", *FAULTS, "kill"), weights=(4, 1, 1, 1, 1, 2))[0]
        size, nth, pause = rng.randrange(3), (2, 2, 3)[rng.randrange(3)], rng.uniform(0, 0.2)
        if clean:
            return cls(0, None, False, "clean", size, nth, pause)
        return cls(changes, other if change_sets else None, expire, action, size, nth, pause)


class Rounds:
    """One seed's harvester, server, Dagster instance and since sensor, round by round."""

    def __init__(self, p: Profile, world: World, server: OAIServer,
                 instance: dg.DagsterInstance) -> None:
        self.p, self.world, self.server, self.instance = p, world, server, instance
        self.rng = random.Random(f"rounds-{p.seed}")
        self.store = Store()
        # Sets change between rounds: the sweep of the old selection may tombstone any
        # share of the store (its cap has tests of its own, in test_sweep.py).
        self.h = add_harvester(HID, server.base_url, sets=p.sets, max_parallel=p.max_parallel,
                               max_retries=0, timeout=15, max_delete="100%")
        self.job = build_definitions([self.h], LOCATION).resolve_job_def(self.h.job_name)
        self.raw_key = asset_keys(HID)[1]
        self.cursor: str | None = None
        self.narrowed = bool(p.sets)  # a selection other than everything was harvested
        self.since_sets: set[str] | None = None  # the sets of the last successful run
        self.clocks: dict[int, datetime] = {}  # round -> server clock
        self.interrupted: list[int] = []  # rounds that left a checkpoint since a success
        self.log: list[str] = []
        self.outcomes: dict[str, int] = {}

    # -- helpers ----------------------------------------------------------------------

    def row(self) -> Harvester:
        return Registry().get(HID)

    def since(self) -> str | None:
        """The since in force as published (plus newer successful runs)."""
        state = current_state(self.instance, self.raw_key)
        return state.value if state else None

    def tick(self) -> None:
        """One since sensor evaluation, reported as the daemon does."""
        result = sensors.evaluate(self.instance, self.cursor, [self.row()], LOCATION)
        sensors.report(self.instance, result)
        self.cursor = result.cursor
        assert json.loads(self.cursor)["since"].get(HID) == self.since(), result.lines

    # -- one round -----------------------------------------------------------------------

    def play(self, r: int, *, clean: bool = False) -> str:
        """Change the server, maybe the harvester's sets, then harvest (failing on
        purpose unless `clean`), check the outcome and return it."""
        w = self.world
        plan = Plan.draw(self.rng, self.row().sets, clean=clean)
        w.advance()
        self.clocks[r] = w.clock
        changes = w.mutate(plan.changes) if r > 1 else []
        self.log.append(f"round {r} at {w.clock:%Y-%m-%dT%H:%M:%SZ}: {plan}; changes {changes}")
        if plan.new_sets is not None and r > 1:
            Registry().update(HID, sets=plan.new_sets)
            self.narrowed |= bool(plan.new_sets)
        before = self.store.state(HID)
        if plan.expire_tokens and before and before["checkpoint"]:
            self.server.expire_tokens()
        self.server.page_size = self.page_size(plan)
        since_before = self.since()
        t0 = time.monotonic()
        if plan.action == "kill":
            outcome, meta = self.kill(r, plan), None
        else:
            outcome, meta = self.harvest(plan, (before or {}).get("checkpoint"))
        self.tick()
        mode = meta["oai/mode"].value if meta else None
        if meta is None:
            assert self.since() == since_before, "since moved without a successful run"
            actual = stored(self.store, HID)
            self.check_history(actual, actual)
            state = self.store.state(HID)
            if outcome == "child finished":
                self.interrupted = []
            elif state["checkpoint"]:
                self.interrupted.append(r)
        else:
            self.check_since(r, meta, before, since_before)
            if mode == "resumed":
                self.check_resumed(before)
            else:
                self.check_converged(swept="oai/selection_swept" in meta)
            if not self.store.state(HID)["checkpoint"]:
                self.interrupted = []  # else a list of other sets is left to continue
        outcome += f" ({mode})" if mode else ""
        self.log.append(f"round {r}: page size {self.server.page_size} -> {outcome}, "
                        f"since {self.since()} ({time.monotonic() - t0:.1f}s)")
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return outcome

    def page_size(self, plan: Plan) -> int:
        """Larger pages for full harvests; small ones when a fault or a kill must meet
        a list (incremental lists are short)."""
        full = resolve_since(self.instance, self.row(), since=None, full=False,
                             raw_key=self.raw_key).value is None
        sizes = (FULL_PAGE_SIZES if full else PAGE_SIZES if plan.action == "clean"
                 else KILL_PAGE_SIZES if plan.action == "kill" else FAULT_PAGE_SIZES)
        return sizes[plan.size]

    def harvest(self, plan: Plan, checkpoint: dict | None) -> tuple[str, dict | None]:
        """Run the harvester's job with the plan's fault; (outcome, raw_records
        materialization metadata, None when the run failed). `checkpoint`: the one
        before the run, which a success leaves only when it read other lists."""
        fault = None
        self.server.clear_log()
        if plan.action != "clean":
            fault = self.server.faults.add(
                plan.action, verb="ListRecords", when=from_nth_list_request(plan.nth),
                times=None if plan.action == "status" else 1, status=500)
        result = self.job.execute_in_process(
            run_config={"ops": {op_name(HID): {"config": {}}}}, instance=self.instance,
            raise_on_error=False)
        self.server.faults.clear()
        tags = self.instance.get_run_by_id(result.run_id).tags
        sets = set(self.row().sets)
        source = ("none" if self.since_sets is None
                  else "run" if self.since_sets == sets else "scope_changed")
        assert tags["oaipmh/since_source"] == source, tags
        state = self.store.state(HID)
        if not result.success:
            assert fault is not None and fault.fired, "a round without a fault failed"
            assert (state["status"], state["run_id"]) == ("failed", result.run_id), state
            failed = next(q for q in self.server.requests if q.fault == plan.action)
            if "resumptionToken" in failed.params:  # a page of its list was stored
                assert state["checkpoint"], f"no checkpoint after {plan.action} on {failed}"
            return "failed", None
        self.since_sets = sets
        meta = {m.materialization.asset_key.path[-1]: m.materialization.metadata
                for m in result.get_asset_materialization_events()}["raw_records"]
        assert state["status"] == "succeeded", state
        assert state["checkpoint"] is None or (
            state["checkpoint"] == checkpoint and meta["oai/mode"].value != "resumed"), state
        if fault is not None and fault.fired:
            assert plan.action == "bad_token", f"the run succeeded despite {plan.action}"
            return "ok after a restarted list", meta
        return "ok", meta

    def kill(self, r: int, plan: Plan) -> str:
        """A harvest in a child process (from the since a run would use), killed with
        SIGKILL while it waits for a delayed page: its lease and checkpoint stay behind."""
        resolved = resolve_since(self.instance, self.row(), since=None, full=False,
                                 raw_key=self.raw_key)
        fault = self.server.faults.add("delay", verb="ListRecords", seconds=600,
                                       when=from_nth_list_request(plan.nth))
        child = subprocess.Popen(  # $OAIPMH_DATABASE_URL names the same database
            [sys.executable, "-c", CHILD, HID, f"killed-{r}", resolved.value or "",
             "1" if resolved.overlap else "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while not fault.fired and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(plan.pause)
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=30)
            output = child.stdout.read().decode(errors="replace")
            child.stdout.close()
            self.server.faults.clear()
        if child.returncode == 0:
            return "child finished"  # its list was shorter than the delayed request
        assert child.returncode == -signal.SIGKILL, output
        state = self.store.state(HID)
        assert (state["status"], state["run_id"]) == ("running", f"killed-{r}"), state
        assert state["holder"].rpartition(":")[2].partition("@")[0] == str(child.pid)
        return "killed"

    # -- checks ------------------------------------------------------------------------

    def check_since(self, r: int, meta: dict, before: dict | None,
                    since_before: str | None) -> None:
        """A fresh list moves since to this round's clock; a resumed one to the start of
        the interrupted list (a round since the last success that left a checkpoint); a
        run that may not advance it (a resumed list that ended short) leaves it."""
        gran = self.world.granularity
        if meta["oai/mode"].value != "resumed":
            assert meta["oai/advances_since"].value is True, meta
            assert self.since() == format_datestamp(self.clocks[r], gran)
            return
        checkpoint = (before or {}).get("checkpoint")
        assert checkpoint and checkpoint.get("list_start"), before
        start = parse_user_datetime(checkpoint["list_start"])
        assert start in [self.clocks[i] for i in self.interrupted], (
            f"the resumed list started at {start}, in no interrupted round since the last "
            f"success ({self.interrupted})")
        if meta["oai/advances_since"].value is True:
            assert self.since() == format_datestamp(start, gran)
        else:
            assert meta["oai/since_note"].value, meta
            assert self.since() == since_before

    def check_converged(self, swept: bool = False) -> None:
        """The store equals the server for the harvester's selection; after a run that
        swept a changed selection, nothing outside it is live."""
        w, sets = self.world, self.row().sets
        expected = w.expected(sets)
        actual = stored(self.store, HID)
        wrong = differences(actual, expected, expected)
        assert not wrong, f"{len(wrong)} records differ (stored, served): {list(wrong.items())[:5]}"
        snap = self.store.snapshot(HID)
        assert {k: snap[k] for k in expected} == expected_snapshot(w.dataset, sets=sets)
        extra = set(actual) - set(expected)
        if not self.narrowed:
            assert not extra, f"records the server does not list: {sorted(extra)[:5]}"
        if swept:
            live = sorted(k for k in extra if not actual[k][1])
            assert not live, f"live records outside the selection after its sweep: {live[:5]}"
        self.check_history(actual, extra)

    def check_resumed(self, before: dict) -> None:
        """The store equals the server for the records unchanged since the resumed list
        started, and holds versions the server served for the rest."""
        start = parse_user_datetime(before["checkpoint"]["list_start"])
        started_in = min(i for i in self.interrupted if self.clocks[i] == start)
        w = self.world
        expected = w.expected(self.row().sets)
        actual = stored(self.store, HID)
        settled = [k for k in expected if w.changed_in[k] <= started_in]
        wrong = differences(actual, expected, settled)
        assert not wrong, (f"{len(wrong)} records unchanged since the list started differ "
                           f"(stored, served): {list(wrong.items())[:5]}")
        self.check_history(actual, actual)

    def check_history(self, actual: dict, keys: Iterable[str]) -> None:
        """Each of `keys` in the store is a version the server has served, or the
        tombstone the sweep of a changed selection made of one outside it now."""
        swept = {i["oai_identifier"] for i in self.store.iter_records(HID, errors_only=True)
                 if any(e.get("location") == "selection" for e in i["errors"])}
        foreign = {k: actual[k] for k in keys if actual[k] not in self.world.history.get(k, ())
                   and not (k in swept and actual[k][1])}
        assert not foreign, f"versions the server never served: {list(foreign.items())[:5]}"


@contextlib.contextmanager
def _worker_setting(records: int | None) -> Iterator[None]:
    """`$OAIPMH_HARVEST_WORKER` at `records` while a seed plays (None: as it is); the
    processes a round starts inherit it."""
    if records is None:
        yield
        return
    before = os.environ.get(WORKER_ENV)
    os.environ[WORKER_ENV] = str(records)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(WORKER_ENV, None)
        else:
            os.environ[WORKER_ENV] = before


def play_seed(p: Profile) -> dict[str, int]:
    """All rounds of one seed, then clean rounds until one reads fresh lists."""
    world = World(p)
    # Dagster's SQLite storage commits every event: on tmpfs a run costs a third.
    ram = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with _worker_setting(p.worker), tempfile.TemporaryDirectory(dir=ram) as home, \
            dg.instance_for_test(temp_dir=home) as instance, OAIServer(
                world.dataset, page_size=PAGE_SIZES[0], snapshot_lists=p.snapshot_lists
            ) as server:
        server.clock = lambda: world.clock
        rounds = Rounds(p, world, server, instance)
        r = 0
        try:
            for r in range(1, p.rounds + 1):
                rounds.play(r)
            for r in range(p.rounds + 1, p.rounds + 3):
                outcome = rounds.play(r, clean=True)
                if outcome.startswith("ok") and "resumed" not in outcome:
                    break
            else:
                pytest.fail("two clean rounds did not read fresh lists")
        except BaseException as exc:
            exc.add_note(f"seed {p.seed}, round {r}, {p}\n" + "\n".join(rounds.log))
            raise
        return rounds.outcomes


@pytest.mark.parametrize("seed", SEEDS)
def test_store_converges_to_the_server(database_url: str, seed: int) -> None:
    outcomes = play_seed(profile(seed, ROUNDS))
    print(f"seed {seed}: {outcomes}")


@pytest.mark.parametrize(("seed", "rounds"), SOAK_PLAYS)
def test_store_converges_to_the_server_soak(database_url: str, seed: int, rounds: int) -> None:
    outcomes = play_seed(profile(seed, rounds))
    print(f"seed {seed}: {outcomes}")
