"""The per-harvester harvest lease: at most one harvest (or re-transform) of a harvester
writes at a time.

- A lease is a row of `oaipmh_harvest_state` with a fresh random `lease` token; the
  holder keeps its `heartbeat_at` fresh from a daemon thread, independently of pages.
- A waiting run takes over only a holder proven dead: its process is gone (same host;
  a process that reuses its PID is told apart by its start time),
  the orchestrator says its run finished (`is_stale`), or, on another host, its heartbeat
  is older than `STALE_AFTER`.
- Every write of the holder is fenced: it updates the state row matching its token in
  the same transaction, and raises `LeaseLost` (writing nothing) when another run has
  taken over.
- A second run of the same harvester waits (polling in short slices) while a live holder
  has the lease.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import types
import uuid
import weakref
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine

from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.ports import (
    HarvestInProgress,
    IsStale,
    LeaseLost,
    LeaseWaitCancelled,
    StoreError,
)

__all__ = ["HEARTBEAT_EVERY", "KEEP", "POLL_EVERY", "STALE_AFTER", "HarvestInProgress",
           "IsStale", "Lease", "LeaseLost", "LeaseWaitCancelled", "Leases", "StoreError",
           "holder_id", "process_start", "state_table"]

log = logging.getLogger(__name__)

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

state_table = sa.Table(
    "oaipmh_harvest_state",
    db.metadata,
    sa.Column("harvester_id", sa.String(48), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("holder", sa.String(255), nullable=True),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("checkpoint", JSON, nullable=True),
    sa.Column("lease", sa.String(32), nullable=True),
    # The selection (`incremental.scope`) whose records the store holds: set by a harvest
    # that covered it; another value means a sweep of the old selection is pending.
    sa.Column("selection", sa.String(16), nullable=True),
)

# A holder on another host whose heartbeat is older than this is dead.
STALE_AFTER = timedelta(minutes=5)
HEARTBEAT_EVERY = 15.0  # seconds between heartbeats
POLL_EVERY = 2.0  # seconds between attempts while waiting for a live holder
LOG_WAIT_EVERY = 60.0  # seconds between "waiting for ..." lines
_SLICE = 0.2  # the longest uninterrupted sleep while waiting

KEEP: Any = object()  # `fence`: leave the checkpoint as it is


def _now() -> datetime:
    return datetime.now(UTC)


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _stamp(value: datetime | None) -> str:
    value = _aware(value)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else "-"


@functools.cache
def _boot_id() -> str:
    """This machine's boot (Linux), or '' where unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()[:8]
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """When process `pid` started, as `<boot>.<clock ticks since boot>` (Linux), so that
    a later process given the same PID is told apart; None where unknown or gone."""
    boot = _boot_id()
    if not boot:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return f"{boot}.{fields[19]}" if len(fields) > 19 else None


def holder_id() -> str:
    """This process as a lease holder: `host:pid`, with `@<start>` where the start of a
    process is known (see `process_start`)."""
    pid = os.getpid()
    start = process_start(pid)
    return f"{socket.gethostname()}:{pid}" + (f"@{start}" if start else "")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder_alive(pid: int, start: str | None) -> bool:
    """Whether the holder process `pid` (started at `start`, when recorded) still runs:
    a live process with that PID that started at another time is not the holder (its
    PID was reused)."""
    if not _process_alive(pid):
        return False
    if not start:
        return True
    now = process_start(pid)
    return now is None or now == start


def _beat(owner: weakref.ref, engine: Engine, lease: Lease, every: float) -> None:
    """The heartbeat thread: refresh `heartbeat_at` until the lease is released or lost,
    or nothing holds its store any more."""
    c = state_table.c
    while not lease.stop.wait(every) and owner() is not None:
        try:
            with engine.begin() as conn:
                n = conn.execute(
                    state_table.update()
                    .where(c.harvester_id == lease.harvester_id, c.lease == lease.token,
                           c.status == "running")
                    .values(heartbeat_at=_now())
                ).rowcount
        except Exception as exc:  # noqa: BLE001 - a missed beat is retried
            log.warning("heartbeat of the lease of %s failed: %s", lease.harvester_id, exc)
            continue
        if n != 1:
            lease.lost = True
            log.warning("run %s lost the lease of %s to another run",
                        lease.run_id, lease.harvester_id)
            return


@dataclass
class Lease:
    """A lease this process holds."""

    harvester_id: str
    run_id: str
    token: str
    previous_status: str | None
    checkpoint: dict[str, Any] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    lost: bool = False



# A page's fence (`Leases.fence`), built once: building the UPDATE for every page cost
# about as much as running it.
_FENCE_WHERE = (state_table.c.harvester_id == sa.bindparam("h"),
                state_table.c.lease == sa.bindparam("token"),
                state_table.c.status == "running")
_FENCE = state_table.update().where(*_FENCE_WHERE).values(heartbeat_at=sa.bindparam("beat"))
_FENCE_SAVING = _FENCE.values(checkpoint=sa.bindparam("checkpoint"))

class Leases:
    """Acquire, heartbeat, fence and release harvest leases on one engine."""

    def __init__(self, engine: Engine, *, heartbeat_every: float = HEARTBEAT_EVERY,
                 poll_every: float = POLL_EVERY, stale_after: timedelta = STALE_AFTER,
                 wait_limit: float | None = None) -> None:
        self.engine = engine
        self.heartbeat_every = heartbeat_every
        self.poll_every = poll_every
        self.stale_after = stale_after
        self.wait_limit = wait_limit
        self._held: dict[tuple[str, str], Lease] = {}
        self._lock = threading.Lock()

    def held(self, harvester_id: str, run_id: str | None) -> Lease | None:
        """The lease this process holds (or held and lost) for that run, if any."""
        if run_id is None:
            return None
        return self._held.get((harvester_id, run_id))

    # -- acquiring ------------------------------------------------------------------------

    def acquire(
        self, harvester_id: str, run_id: str, *, is_stale: IsStale | None = None,
        wait: bool = True, wait_limit: float | None | types.EllipsisType = ...,
        cancel: threading.Event | None = None, logger: Any = None,
    ) -> tuple[Lease, dict[str, Any] | None]:
        """Take the lease for `run_id`, waiting while a live holder has it; return it and
        the previous run's checkpoint. `wait=False` or `wait_limit=0` never wait; a limit
        in seconds raises `HarvestInProgress` when exceeded; None waits as long as the
        holder lives (the store's default limit when not given). `cancel` ends the wait."""
        limit = self.wait_limit if wait_limit is ... else wait_limit
        deadline = None if limit is None else time.monotonic() + limit
        logger = logger or log
        logged_at: float | None = None
        while True:
            taken, row = self._try_take(harvester_id, run_id, is_stale)
            if taken is not None:
                if logged_at is not None:
                    logger.info("took the lease of %s after waiting", harvester_id)
                return taken
            if row is None:  # lost a race for a free lease: try again at once
                continue
            now = time.monotonic()
            if not wait or (deadline is not None and now >= deadline):
                raise HarvestInProgress(self._busy_message(harvester_id, row, waited=logged_at))
            if logged_at is None or now - logged_at >= LOG_WAIT_EVERY:
                logged_at = now if logged_at is None else logged_at + LOG_WAIT_EVERY
                logger.info("waiting for run %s (%s) to finish its harvest of %s",
                            row["run_id"], row["holder"], harvester_id)
            self._sleep(min(self.poll_every, deadline - now) if deadline is not None
                        else self.poll_every, cancel, harvester_id)

    @staticmethod
    def _sleep(seconds: float, cancel: threading.Event | None, harvester_id: str) -> None:
        """Sleep in short slices, so that an interrupt or `cancel` ends it promptly."""
        end = time.monotonic() + max(seconds, 0.0)
        while True:
            if cancel is not None and cancel.is_set():
                raise LeaseWaitCancelled(
                    f"stopped waiting for the lease of harvester {harvester_id!r}: cancelled")
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, _SLICE))

    @staticmethod
    def _busy_message(harvester_id: str, row: Any, *, waited: float | None) -> str:
        return (
            f"harvester {harvester_id!r} is being harvested by run {row['run_id']} "
            f"({row['holder']}, since {_stamp(row['started_at'])})"
            + (f"; still running after waiting {time.monotonic() - waited:.0f} s"
               if waited is not None else "")
            + "; one harvest per harvester at a time"
        )

    def _try_take(
        self, harvester_id: str, run_id: str, is_stale: IsStale | None
    ) -> tuple[tuple[Lease, dict | None] | None, Any]:
        """One attempt: ((lease, checkpoint), None) when taken, (None, holder row) while a
        live holder has it, (None, None) when another run took it just now."""
        token = uuid.uuid4().hex
        try:
            taken = self._take(harvester_id, run_id, is_stale, token)
        except sa.exc.IntegrityError:  # another run inserted the state row just now
            return None, None
        if not isinstance(taken, Lease):
            return None, taken  # the holder's row, or None after a lost race
        lease = taken
        self._start(lease)
        return (lease, lease.checkpoint), None

    def _take(self, harvester_id: str, run_id: str, is_stale: IsStale | None,
              token: str) -> Lease | Any:
        """The transaction of `_try_take`: the new lease, or the live holder's row, or
        None when the conditional update found the row changed."""
        now, holder = _now(), holder_id()
        c = state_table.c
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:h))"),
                             {"h": harvester_id})
            row = conn.execute(
                sa.select(state_table).where(c.harvester_id == harvester_id)
            ).mappings().first()
            values = {"run_id": run_id, "status": "running", "holder": holder,
                      "started_at": now, "heartbeat_at": now, "lease": token}
            if row is None:
                conn.execute(state_table.insert().values(
                    harvester_id=harvester_id, checkpoint=None, **values))
                previous, checkpoint = None, None
            else:
                if (row["status"] == "running" and row["run_id"] != run_id
                        and not self._dead(row, is_stale)):
                    return row
                result = conn.execute(
                    state_table.update()
                    .where(c.harvester_id == harvester_id,
                           c.lease.is_not_distinct_from(row["lease"]),
                           c.started_at.is_not_distinct_from(row["started_at"]),
                           c.status == row["status"])
                    .values(**values)
                )
                if result.rowcount != 1:
                    return None
                previous, checkpoint = row["status"], row["checkpoint"]
        return Lease(harvester_id, run_id, token, previous, checkpoint)

    def _dead(self, row: Any, is_stale: IsStale | None) -> bool:
        """Whether the holder of `row` is proven dead."""
        host, _, process = (row["holder"] or "").rpartition(":")
        pid, _, start = process.partition("@")
        if is_stale is not None and is_stale(row["run_id"]):
            return True  # the orchestrator says its run has finished
        if host == socket.gethostname() and pid.isdigit():
            return not _holder_alive(int(pid), start or None)
        beat = _aware(row["heartbeat_at"])
        return beat is None or _now() - beat > self.stale_after

    # -- holding --------------------------------------------------------------------------

    def _start(self, lease: Lease) -> None:
        with self._lock:
            for key, other in list(self._held.items()):
                if key[0] == lease.harvester_id and other is not lease:
                    other.lost = True  # superseded in this very process
                    other.stop.set()
            self._held[(lease.harvester_id, lease.run_id)] = lease
        lease.thread = threading.Thread(
            target=_beat, args=(weakref.ref(self), self.engine, lease, self.heartbeat_every),
            daemon=True, name=f"oaipmh-lease-{lease.harvester_id}",
        )
        lease.thread.start()

    def fence(self, conn: sa.Connection, lease: Lease, checkpoint: Any = KEEP) -> None:
        """In the caller's transaction: confirm that `lease` still holds the harvester
        (refreshing its heartbeat, saving `checkpoint` when given), else raise
        `LeaseLost`. Call it before the transaction's other writes."""
        c = state_table.c
        n = 0
        if not lease.lost:
            params: dict[str, Any] = {"h": lease.harvester_id, "token": lease.token,
                                      "beat": _now()}
            if checkpoint is KEEP:
                stmt = _FENCE
            else:
                stmt, params["checkpoint"] = _FENCE_SAVING, checkpoint
            n = conn.execute(stmt, params).rowcount
        if n != 1:
            lease.lost = True
            lease.stop.set()
            row = conn.execute(sa.select(c.run_id, c.holder).where(
                c.harvester_id == lease.harvester_id)).first()
            by = f"run {row.run_id} ({row.holder})" if row else "nobody"
            raise LeaseLost(
                f"run {lease.run_id} no longer holds the lease of harvester "
                f"{lease.harvester_id!r} (now held by {by}): stopped without writing"
            )

    # -- releasing ------------------------------------------------------------------------

    def release(self, harvester_id: str, run_id: str, *, status: str,
                clear_checkpoint: bool, restore: dict[str, Any] | None = None,
                selection: str | None = None) -> bool:
        """End the lease of `run_id` with `status`, clearing its checkpoint when asked
        (or putting `restore` back), and record `selection` when given; False when it
        was no longer held."""
        c = state_table.c
        with self._lock:
            lease = self._held.pop((harvester_id, run_id), None)
        if lease is not None:
            lease.stop.set()
            if lease.thread is not None and lease.thread is not threading.current_thread():
                lease.thread.join(5)
            if lease.lost:
                return False
            match = c.lease == lease.token
        else:
            match = c.run_id == run_id
        values: dict[str, Any] = {"status": status, "heartbeat_at": _now()}
        if clear_checkpoint:
            values["checkpoint"] = restore
        if selection is not None:
            values["selection"] = selection
        with self.engine.begin() as conn:
            n = conn.execute(
                state_table.update()
                .where(c.harvester_id == harvester_id, match,
                       c.status == "running" if lease is not None else sa.true())
                .values(**values)
            ).rowcount
        return n == 1

    def save_checkpoint(self, harvester_id: str, run_id: str | None,
                        checkpoint: dict | None) -> None:
        """Record the position of the last committed page (fenced when leased here)."""
        lease = self.held(harvester_id, run_id)
        with self.engine.begin() as conn:
            if lease is not None:
                self.fence(conn, lease, checkpoint)
            else:
                self.save_checkpoint_in(conn, harvester_id, run_id, checkpoint)

    @staticmethod
    def save_checkpoint_in(conn: sa.Connection, harvester_id: str, run_id: str | None,
                           checkpoint: dict | None) -> None:
        """Unfenced checkpoint write of a run that holds no lease here (tools, tests)."""
        conn.execute(
            state_table.update()
            .where(state_table.c.harvester_id == harvester_id, state_table.c.run_id == run_id)
            .values(checkpoint=checkpoint, heartbeat_at=_now())
        )

    def state(self, harvester_id: str) -> dict[str, Any] | None:
        """The harvest state row of a harvester (None before its first harvest)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(state_table).where(state_table.c.harvester_id == harvester_id)
            ).mappings().first()
        return dict(row) if row else None

    # -- forgetting -----------------------------------------------------------------------

    def forget(self, harvester_id: str) -> None:
        """Delete the harvester's state row."""
        with self.engine.begin() as conn:
            self.forget_in(conn, harvester_id)

    @staticmethod
    def forget_in(conn: sa.Connection, harvester_id: str) -> None:
        """`forget` in the caller's transaction."""
        conn.execute(state_table.delete().where(state_table.c.harvester_id == harvester_id))

    def selection_changed(self, harvester_id: str, held: str) -> None:
        """Clear the lease and checkpoint (a holder's next fenced write fails), and keep
        the recorded selection, else record `held`."""
        c = state_table.c
        cleared = {"status": "idle", "lease": None, "checkpoint": None, "run_id": None,
                   "holder": None}
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(c.selection).where(c.harvester_id == harvester_id)
                               ).first()
            selection = (row.selection if row is not None else None) or held
            if row is None:
                conn.execute(state_table.insert().values(harvester_id=harvester_id,
                                                         selection=selection, **cleared))
            else:
                conn.execute(state_table.update().where(c.harvester_id == harvester_id)
                             .values(selection=selection, **cleared))
