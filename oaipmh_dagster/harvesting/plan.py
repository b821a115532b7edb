"""What one harvest asks for, decided before the first list request.

`make_plan` is pure (no network, no disk): from the harvester, the run's options, the
server's Identify answer and the interrupted harvest's checkpoint it decides `from` and
`until`, the sets, the date windows of a parallel harvest and where to resume. The page
loop (`harvest`) executes the plan; `Checkpoint` is what it saves after each page.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import Any

from oaipmh_dagster.errors import OAIPMHDagsterError
from oaipmh_dagster.harvesting import incremental
from oaipmh_dagster.harvesting.windows import Window, WindowState
from oaipmh_dagster.oai import Granularity, Identify, format_datestamp, parse_user_datetime
from oaipmh_dagster.storage.registry import SET_SPEC_PATTERN, Harvester


class PlanError(OAIPMHDagsterError, RuntimeError):
    """The run's options cannot make a harvest (bad input: nothing was harvested)."""


class PlanMode(StrEnum):
    """What kind of harvest a plan is (its value is the `oai/mode` a run reports)."""

    INCREMENTAL = "incremental"
    FULL = "full"
    OAI_IDS = "oai_ids"
    RESUMED = "resumed"


@dataclass(frozen=True)
class SinceChoice:
    """The since a run's caller resolved once the harvester's lease is held: `since`
    (None: none), `full`, `overlap` (ask a little earlier: a since a run recorded) and
    `source`, where a remembered since came from (None: the run's own, from its config)."""

    since: str | None
    full: bool = False
    overlap: bool = False
    source: str | None = None


@dataclass(frozen=True)
class RunOptions:
    """What a run asks of one harvest.

    `since`/`until` are user input (a date or datetime); `full` ignores `since`;
    `overlap` asks a little before `since` (a remembered since: see `incremental`);
    `oai_ids` fetches exactly those records with GetRecord; `sets` replaces the
    harvester's sets; `resume=False` ignores the interrupted harvest's checkpoint;
    `reconcile` compares the listed identifiers with the store after the lists;
    `allow_mass_delete` lets a sweep tombstone more than the harvester's `max_delete`.
    `since_source` names where a remembered since came from (e.g. "since recorded by run
    1a2b3c4d"); None: `since` is the caller's own (run config, CLI), and a since the
    one rule (`incremental.check_since`) refuses as ahead of the clock fails the run
    instead of harvesting in full. A `until` without a time means the end of that day."""

    since: str | datetime | None = None
    until: str | datetime | None = None
    full: bool = False
    overlap: bool = False
    since_source: str | None = None
    oai_ids: Sequence[str] = ()
    sets: Sequence[str] | None = None
    resume: bool = True
    reconcile: bool = False
    allow_mass_delete: bool = False

    def since_dt(self) -> datetime | None:
        """`since` as a datetime (None on a full harvest or without one)."""
        return None if self.full or self.since in (None, "") else parse_user_datetime(self.since)

    def until_dt(self) -> datetime | None:
        """`until` as a datetime: a day (`YYYY-MM-DD`) means its last second."""
        if self.until in (None, ""):
            return None
        assert self.until is not None
        return until_datetime(self.until)

    def since_label(self) -> str:
        """Where `since` came from, for messages."""
        return self.since_source or "since from the run config"

    def set_specs(self, h: Harvester) -> list[str]:
        return list(h.sets if self.sets is None else self.sets)

    def with_since(self, choice: SinceChoice) -> RunOptions:
        """These options with the since the caller resolved."""
        return replace(self, since=choice.since, full=choice.full, overlap=choice.overlap,
                       since_source=choice.source)


def until_datetime(value: str | date | datetime) -> datetime:
    """A user's `until` as a UTC datetime: a date without a time (`2024-03-10`, a `date`)
    is the end of that day, 23:59:59 (at day granularity it is the same day)."""
    dt = parse_user_datetime(value)
    text = value.strip() if isinstance(value, str) else None
    day_only = (isinstance(value, date) and not isinstance(value, datetime)) or (
        text is not None and _DAY.fullmatch(text) is not None)
    return dt.replace(hour=23, minute=59, second=59) if day_only else dt


_DAY = re.compile(r"[0-9]{4}-?[0-9]{2}-?[0-9]{2}")


def validate(h: Harvester, run: RunOptions) -> None:
    """Raise `PlanError` when the options cannot make a harvest of `h`."""
    since_dt, until_dt = run.since_dt(), run.until_dt()
    if since_dt and until_dt and since_dt > until_dt:
        raise PlanError(f"since {run.since} is after until {run.until}")
    for spec in run.set_specs(h):  # run config sets skip the row's validation
        if not isinstance(spec, str) or not SET_SPEC_PATTERN.fullmatch(spec):
            raise PlanError(f"invalid set spec {spec!r}")
    if run.reconcile and (run.oai_ids or until_dt is not None or not covers_sets(h, run)):
        raise PlanError("reconcile compares the harvester's whole selection: it cannot be "
                        "combined with oai_ids, until or other sets than the harvester's")


def covers_sets(h: Harvester, run: RunOptions) -> bool:
    """Whether the run harvests the harvester's own sets."""
    return sorted(set(run.set_specs(h))) == sorted(set(h.sets))


# -- checkpoints ---------------------------------------------------------------------


@dataclass(frozen=True)
class ListCheckpoint:
    """A sequential harvest stopped inside a list: the token of its next page."""

    token: str
    set_spec: str | None
    metadata_prefix: str
    since: str | None
    until: str | None
    list_start: str  # the server's clock when the earliest list it continues started
    pages: int = 0
    records: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"args": {"metadataPrefix": self.metadata_prefix, "set": self.set_spec,
                         "from": self.since, "until": self.until},
                "token": self.token, "set": self.set_spec, "pages": self.pages,
                "records": self.records, "since": self.since, "until": self.until,
                "list_start": self.list_start}


@dataclass(frozen=True)
class WindowedCheckpoint:
    """A parallel harvest stopped with some windows unfinished."""

    metadata_prefix: str
    sets: tuple[str, ...]
    since: str | None
    until: str | None
    list_start: str
    granularity: Granularity
    windows: tuple[WindowState, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"mode": "windowed", "prefix": self.metadata_prefix, "sets": list(self.sets),
                "since": self.since, "until": self.until, "list_start": self.list_start,
                "windows": {u.key: {**u.window.to_dict(self.granularity), "token": u.token,
                                    "done": u.done, "depth": u.depth}
                            for u in self.windows}}


Checkpoint = ListCheckpoint | WindowedCheckpoint


def checkpoint_from_json(data: Any, granularity: Granularity) -> Checkpoint:
    """The checkpoint saved as `data`; `ValueError` says why it cannot be read."""
    if not isinstance(data, dict):
        raise ValueError("checkpoint is not a JSON object")
    if not data.get("list_start"):
        raise ValueError("checkpoint does not say when its list started")
    list_start = str(data["list_start"])
    try:
        if data.get("mode") == "windowed":
            windows = tuple(
                WindowState(Window.from_dict(item), str(key), item.get("token"),
                            bool(item.get("done")), int(item.get("depth", 1)))
                for key, item in (data.get("windows") or {}).items())
            return WindowedCheckpoint(str(data.get("prefix") or ""), tuple(data.get("sets") or ()),
                                      data.get("since"), data.get("until"), list_start,
                                      granularity, windows)
        args = data.get("args") or {}
        if not data.get("token"):
            raise ValueError("checkpoint holds no resumption token")
        return ListCheckpoint(str(data["token"]), data.get("set"),
                              str(args.get("metadataPrefix") or ""), data.get("since"),
                              data.get("until"), list_start, int(data.get("pages") or 0),
                              int(data.get("records") or 0))
    except (AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"checkpoint cannot be read ({exc!r})") from exc


# -- the plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one harvest asks for. `since`/`until` are the `from`/`until` sent (in the
    server's granularity); `windows` is set for a parallel harvest, `resume` for a
    sequential one that continues a list; `notes` are warnings to log."""

    mode: PlanMode
    granularity: Granularity
    sets: tuple[str, ...]
    covers_sets: bool
    list_start: datetime  # the server's clock before this run's first list request
    checkpoint_start: str  # the list start its checkpoints keep (an earlier one on resume)
    since: str | None = None
    until: str | None = None
    oai_ids: tuple[str, ...] = ()
    windows: tuple[WindowState, ...] | None = None
    window_range: tuple[datetime, datetime] | None = None
    resume: ListCheckpoint | None = None
    resumed_list_start: datetime | None = None
    notes: tuple[tuple[str, str], ...] = ()  # (logger method, message)
    # The saved checkpoint of a list this harvest neither resumes nor reads whole: left
    # for the harvest that continues it when this one succeeds (None: a success clears).
    keeps: Any = None
    since_in_force: str | None = None  # the run's since once the one rule accepted it

    @property
    def windowed(self) -> bool:
        return self.windows is not None


def make_plan(
    h: Harvester, run: RunOptions, ident: Identify, checkpoint: Any = None,
    now: datetime | None = None,
) -> Plan:
    """Decide the harvest of `h` for `run` against a server that answered Identify with
    `ident`, resuming the saved `checkpoint` (its JSON) when it still applies; `now` is
    this machine's clock when the harvest asked for Identify."""
    validate(h, run)
    gran = ident.granularity
    now = now or datetime.now(UTC)
    notes: list[tuple[str, str]] = []
    since_dt, in_force = (None, None) if run.oai_ids else judged_since(run, ident, now, notes)
    until_dt = run.until_dt()
    if since_dt is not None and run.overlap:
        since_dt = incremental.request_from(since_dt, gran, h.overlap)
    sets = tuple(dict.fromkeys(run.set_specs(h)))
    listed = incremental.trusted_start(ident.response_date, now, ident.earliest_datestamp)
    base: dict[str, Any] = {
        "granularity": gran, "sets": sets, "covers_sets": covers_sets(h, run),
        "list_start": ident.response_date, "checkpoint_start": listed.isoformat(),
        "since": format_datestamp(since_dt, gran) if since_dt else None,
        "until": format_datestamp(until_dt, gran) if until_dt else None,
        "since_in_force": in_force,
    }
    if run.oai_ids:
        return Plan(mode=PlanMode.OAI_IDS, oai_ids=tuple(run.oai_ids), keeps=checkpoint or None,
                    notes=_kept_note(_parsed(checkpoint, gran)), **base)
    mode = PlanMode.FULL if since_dt is None else PlanMode.INCREMENTAL
    saved = _read_checkpoint(checkpoint, gran, notes)
    usable = saved if run.resume else None
    start = since_dt or ident.earliest_datestamp
    if h.max_parallel > 1 and start is not None:
        end = until_dt or ident.response_date
        windows = _resumed_windows(usable, h, base)
        if windows is not None:
            assert isinstance(saved, WindowedCheckpoint)
            return Plan(mode=PlanMode.RESUMED, windows=windows, window_range=(start, end),
                        resumed_list_start=_when(saved.list_start), notes=tuple(notes),
                        **{**base, "checkpoint_start": saved.list_start})
        fresh = []
        for spec in sets or (None,):
            w = Window(spec, start, end, open_start=since_dt is None, open_end=until_dt is None)
            fresh.append(WindowState(w, w.key(gran)))
        keeps = _kept(saved, checkpoint, h, base, notes)
        return Plan(mode=mode, windows=tuple(fresh), window_range=(start, end),
                    notes=tuple(notes), keeps=keeps, **base)
    if h.max_parallel > 1:
        notes.append(("info", "the server gives no earliestDatestamp: harvesting sequentially"))
    resume = _resumed_list(usable, h, base)
    if resume is not None:
        return Plan(mode=PlanMode.RESUMED, resume=resume, resumed_list_start=_when(resume.list_start),
                    notes=tuple(notes), **{**base, "checkpoint_start": resume.list_start})
    keeps = _kept(saved, checkpoint, h, base, notes)
    return Plan(mode=mode, notes=tuple(notes), keeps=keeps, **base)


def _parsed(data: Any, gran: Granularity) -> Checkpoint | None:
    """The checkpoint saved as `data`; None when there is none or it cannot be read."""
    try:
        return checkpoint_from_json(data, gran) if data else None
    except ValueError:
        return None


def _kept(saved: Checkpoint | None, data: Any, h: Harvester, base: dict[str, Any],
          notes: list[tuple[str, str]]) -> Any:
    """The saved checkpoint's JSON when this harvest, which does not resume it, leaves
    part of its list unread; None when the harvest reads that whole list again, or it
    belongs to another prefix. Either way a note says what becomes of it."""
    if saved is None:
        return None
    if saved.metadata_prefix != h.metadata_prefix or _holds(base, saved):
        notes.append(("info", f"not resuming the interrupted harvest ({_list_of(saved)}): "
                      "this harvest reads that list whole, from its start"))
        return None
    notes.extend(_kept_note(saved))
    return data


def _kept_note(saved: Checkpoint | None) -> tuple[tuple[str, str], ...]:
    if saved is None:
        return ()
    return (("info", f"this harvest keeps the interrupted harvest's checkpoint "
             f"({_list_of(saved)}): it does not read that list whole, and that harvest, "
             "run again, resumes it"),)


def _list_of(saved: Checkpoint) -> str:
    """The list a checkpoint belongs to, for a note."""
    sets = ([saved.set_spec] if isinstance(saved, ListCheckpoint) and saved.set_spec
            else list(getattr(saved, "sets", ())))
    where = f"set {', '.join(sets)}" if sets else "the whole repository"
    return (f"{saved.metadata_prefix}, from={saved.since or '-'}, "
            f"until={saved.until or '-'}, {where}")


def _holds(base: dict[str, Any], saved: Checkpoint) -> bool:
    """Whether the lists of a plan (`base`) hold every record of the saved one's: from
    no later, until no earlier, over its sets (or the whole repository)."""
    return (_reaches(base["since"], saved.since, start=True)
            and _reaches(base["until"], saved.until, start=False)
            and _covers(base["sets"], saved))


def _reaches(mine: str | None, theirs: str | None, *, start: bool) -> bool:
    """Whether our bound (from when `start`, else until; None: unbounded) reaches at
    least as far as theirs."""
    if mine is None or theirs is None:
        return mine is None
    a, b = _when(mine), _when(theirs)
    return a is not None and b is not None and (a <= b if start else a >= b)


def _covers(sets: tuple[str, ...], saved: Checkpoint) -> bool:
    """Whether lists over `sets` (none: the whole repository) hold the saved one's."""
    theirs = ({saved.set_spec} - {None} if isinstance(saved, ListCheckpoint)
              else set(saved.sets))
    return not sets or (bool(theirs) and theirs <= set(sets))


def judged_since(
    run: RunOptions, ident: Identify, now: datetime, notes: list[tuple[str, str]]
) -> tuple[datetime | None, str | None]:
    """The run's since once the one rule (`incremental.check_since`) has judged it, and
    the since it keeps in force (None: harvest in full). A since before the repository's
    earliestDatestamp is asked without `from`, as is a remembered one ahead of the clock
    (a warning says so); the run's own since ahead of the clock fails it (`PlanError`)."""
    since_dt = run.since_dt()
    if since_dt is None or run.since is None:
        return None, None
    check = incremental.check_since(run.since, run.since_label(), now=now,
                                    earliest=ident.earliest_datestamp)
    if check.verdict == "ahead" and run.since_source is None:
        raise PlanError(f"{check.message}: nothing would be harvested")
    if check.when is None:
        notes.append(("warning", f"{check.message}: harvesting in full (no from) instead"))
        return None, None
    return since_dt, (run.since if isinstance(run.since, str)
                      else format_datestamp(since_dt, Granularity.SECOND))


def _read_checkpoint(
    data: Any, gran: Granularity, notes: list[tuple[str, str]]
) -> Checkpoint | None:
    if not data:
        return None
    try:
        return checkpoint_from_json(data, gran)
    except ValueError as exc:
        notes.append(("warning", f"the interrupted harvest's {exc}: starting the list "
                      "again instead of resuming it"))
        return None


def _when(text: str) -> datetime | None:
    try:
        return parse_user_datetime(text)
    except (TypeError, ValueError):
        return None


def _resumed_windows(
    saved: Checkpoint | None, h: Harvester, base: dict[str, Any]
) -> tuple[WindowState, ...] | None:
    """The saved windows, when the checkpoint is of this same windowed harvest."""
    if not isinstance(saved, WindowedCheckpoint):
        return None
    same = (saved.metadata_prefix == h.metadata_prefix and list(saved.sets) == list(base["sets"])
            and saved.since == base["since"] and saved.until == base["until"])
    return saved.windows if same else None


def _resumed_list(
    saved: Checkpoint | None, h: Harvester, base: dict[str, Any]
) -> ListCheckpoint | None:
    """The saved list position, when the checkpoint belongs to this same list."""
    if not isinstance(saved, ListCheckpoint):
        return None
    sets = base["sets"]
    same = (saved.since == base["since"] and saved.until == base["until"]
            and saved.metadata_prefix == h.metadata_prefix
            and (saved.set_spec in sets if sets else not saved.set_spec))
    return saved if same else None
