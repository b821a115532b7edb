"""Import many harvesters at once: every row validated (and its endpoint probed) before
anything is written, then one transaction, then one reload per shard that holds a
changed harvester. The one code path of `oaipmh-dagster harvester import` and of the
`manage_harvesters` job's `import` action.

A new row is the whole harvester, as `harvester add` with those options would register
it: what it leaves out takes add's default. An id already registered is refused unless
`update`; then the columns the row gives replace the harvester's fields and those it
leaves out keep their stored values (an empty cell is the default, except an empty
name, which keeps the stored name), by `harvester update`'s rules: a changed URL,
prefix or sets forget the harvest state. A row equal to the stored harvester is left
alone."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import sqlalchemy as sa

from oaipmh_dagster.errors import OAIPMHDagsterError
from oaipmh_dagster.operations.admin import (
    SELECTION,
    AdminError,
    Endpoint,
    Line,
    ask_endpoint,
    check_offer,
    new_harvester,
    selection_changed,
)
from oaipmh_dagster.operations.harvester_files import Row, filled_from, row_fields
from oaipmh_dagster.operations.shards import shard_of
from oaipmh_dagster.storage.registry import (
    Harvester,
    HarvesterExists,
    HarvesterNotFound,
    InvalidRow,
    Registry,
    RegistryError,
)

__all__ = ["PROBE_WORKERS", "BadRow", "Imported", "Plan", "plan_import", "write_import"]

# Endpoints probed at once (each endpoint once, however many rows name it).
PROBE_WORKERS = 8
# The fields a row gives; `created` and `updated` are the registry's.
_FIELDS = tuple(f.name for f in dataclasses.fields(Harvester)
                if f.name not in ("created", "updated"))

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class BadRow:
    """A row refused: where (`number`, 1-based, and `label`), which harvester, why;
    `usage`: bad input (else the endpoint or the registry refused)."""

    number: int
    label: str
    harvester_id: str | None
    message: str
    usage: bool = True

    def __str__(self) -> str:
        named = f" ({self.harvester_id})" if self.harvester_id else ""
        return f"{self.label}{named}: {self.message}"


@dataclass
class Plan:
    """What an import would do: `new` rows, `changed` (stored, wanted) pairs, the ids
    left `unchanged`, and the `bad` rows."""

    rows: int = 0
    new: list[Harvester] = field(default_factory=list)
    changed: list[tuple[Harvester, Harvester]] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    bad: list[BadRow] = field(default_factory=list)

    @property
    def usage(self) -> bool:
        """Whether every bad row is bad input."""
        return all(b.usage for b in self.bad)


@dataclass
class Imported:
    """What an import wrote, and its lines (notes: warnings)."""

    added: list[Harvester] = field(default_factory=list)
    updated: list[Harvester] = field(default_factory=list)
    reloads: int = 0
    lines: list[Line] = field(default_factory=list)


@dataclass
class _Wanted:
    row: Row
    harvester: Harvester
    name_given: bool
    current: Harvester | None = None


def _wanted(row: Row) -> _Wanted:
    """The harvester a row asks for (before the probe); `AdminError` or ValueError."""
    if row.problem is not None:
        raise AdminError(row.problem, usage=True)
    values = row_fields(row)
    harvester_id = values.pop("id")
    if harvester_id is None:
        raise AdminError("no id", usage=True)
    values["sets"] = tuple(values["sets"] or ())
    values["timezone"] = values["timezone"] or "UTC"
    values["enabled"] = True if values["enabled"] is None else values["enabled"]
    return _Wanted(row, new_harvester(harvester_id, **values), values["name"] is not None)


def _row_id(row: Row) -> str | None:
    value = row.values.get("id")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) and value else None


def plan_import(registry: Registry, rows: Sequence[Row], *, update: bool = False,
                check: bool = True, workers: int = PROBE_WORKERS,
                progress: Progress | None = None) -> Plan:
    """Validate every row, refuse ids given twice, ids registered already (unless
    `update`) and, unless not `check`, rows whose endpoint refuses: the endpoints of new
    rows and of rows that change a harvester's URL, prefix or sets are probed, each once,
    `workers` at a time (`progress(done, total)` after each). Nothing is written."""
    plan = Plan(rows=len(rows))
    seen = Counter(i for i in map(_row_id, rows) if i)
    where: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        if seen[_row_id(row) or ""] > 1:
            where[_row_id(row) or ""].append(row.label.split(" (")[0])
    existing = {r.id: r for r in registry.list_rows()}
    good: list[_Wanted] = []
    for row in rows:
        current = existing.get(_row_id(row) or "")
        if update and isinstance(current, Harvester) and row.problem is None:
            row = filled_from(row, current)
        try:
            wanted = _wanted(row)
        except AdminError as exc:
            plan.bad.append(BadRow(row.number, row.label, _row_id(row), str(exc), exc.usage))
            continue
        except ValueError as exc:
            plan.bad.append(BadRow(row.number, row.label, _row_id(row), str(exc)))
            continue
        h = wanted.harvester
        if seen[h.id] > 1:
            plan.bad.append(BadRow(row.number, row.label, h.id, f"id {h.id!r} is given more than once "
                                   f"({', '.join(where[h.id])})"))
            continue
        stored = existing.get(h.id)
        if isinstance(stored, InvalidRow):
            plan.bad.append(BadRow(row.number, row.label, h.id, f"harvester {h.id!r} is stored with an "
                                   f"invalid value ({stored.error}): repair it with "
                                   "`harvester update` or remove it first", usage=False))
            continue
        if stored is not None and not update:
            plan.bad.append(BadRow(row.number, row.label, h.id, f"harvester {h.id!r} already exists "
                                   "(--update changes it)"))
            continue
        wanted.current = stored
        if stored is not None and not wanted.name_given:
            wanted.harvester = h.replace(name=stored.name)
        good.append(wanted)
    if check:
        good = _probed(plan, good, workers, progress)
    for wanted in good:
        h, stored = wanted.harvester, wanted.current
        if stored is None:
            plan.new.append(h)
        elif h == stored:
            plan.unchanged.append(h.id)
        else:
            plan.changed.append((stored, h))
    return plan


def _needs_probe(wanted: _Wanted) -> bool:
    stored, h = wanted.current, wanted.harvester
    return stored is None or any(getattr(stored, f) != getattr(h, f) for f in SELECTION)


def _probed(plan: Plan, good: list[_Wanted], workers: int,
            progress: Progress | None) -> list[_Wanted]:
    """`good` without the rows whose endpoint refuses (added to `plan.bad`), names
    taken from Identify where a new row gives none."""
    probed = [w for w in good if _needs_probe(w)]
    by_url: dict[str, list[_Wanted]] = defaultdict(list)
    for w in probed:
        by_url[w.harvester.base_url].append(w)
    answers: dict[str, Endpoint | AdminError] = {}
    if by_url:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(by_url)))) as pool:
            futures = {pool.submit(_ask, url, group): url for url, group in by_url.items()}
            for done, future in enumerate(as_completed(futures), 1):
                answers[futures[future]] = future.result()
                if progress is not None:
                    progress(done, len(futures))
    kept = []
    for w in good:
        h = w.harvester
        answer = answers.get(h.base_url) if _needs_probe(w) else None
        try:
            if isinstance(answer, AdminError):
                raise answer
            if answer is not None:
                check_offer(answer, h.metadata_prefix, h.sets)
                if w.current is None and not w.name_given:
                    w.harvester = h.replace(name=answer.repository_name[:255] or h.id)
        except AdminError as exc:
            plan.bad.append(BadRow(w.row.number, w.row.label, h.id, str(exc), exc.usage))
            continue
        kept.append(w)
    plan.bad.sort(key=lambda b: b.number)
    return kept


def _ask(url: str, group: list[_Wanted]) -> Endpoint | AdminError:
    """The endpoint's answer (sets only when a row wants some), or its refusal."""
    try:
        return ask_endpoint(url, max(w.harvester.timeout for w in group),
                            with_sets=any(w.harvester.sets for w in group))
    except AdminError as exc:
        return exc


def write_import(registry: Registry, plan: Plan, *, reload: bool = True,
                 locate: Callable[[str], str | None] = lambda harvester_id: None,
                 ) -> Imported:
    """Write the plan's new and changed rows in one transaction (its bad rows are left
    out), forget the harvest state of changed selections, then reload each shard that
    holds a written harvester once (`locate(id)`: the location to name, None: the one
    the webserver says)."""
    try:
        written = registry.write_many(plan.new, [new for _, new in plan.changed])
    except (HarvesterExists, HarvesterNotFound) as exc:
        raise AdminError(str(exc)) from exc
    done = Imported(written[:len(plan.new)], written[len(plan.new):])
    for h in done.added:
        done.lines.append(Line(f"added harvester {h.id}: {h.base_url} ({h.metadata_prefix})"))
    for old, new in plan.changed:
        fields = sorted(f for f in _FIELDS if getattr(old, f) != getattr(new, f))
        done.lines.append(Line(f"updated harvester {new.id}: {', '.join(fields)}"))
        if SELECTION & set(fields):
            selection_changed(registry, old)
            done.lines.append(Line(f"{new.id}: the URL, prefix or sets changed: the next "
                                   "harvest is a full one"))
    if reload and written:
        _reload(registry, [h.id for h in written], locate, done)
    return done


def shard_groups(ids: Sequence[str], count: int) -> list[list[str]]:
    """`ids` grouped by the shard of `count` that holds them, in shard order."""
    groups: dict[int, list[str]] = defaultdict(list)
    for harvester_id in ids:
        groups[shard_of(harvester_id, count)].append(harvester_id)
    return [groups[k] for k in sorted(groups)]


def _reload(registry: Registry, ids: list[str], locate: Callable[[str], str | None],
            done: Imported) -> None:
    """One reload per shard that holds one of `ids`; never fails the import."""
    from oaipmh_dagster.operations.reload import reload_code_location

    try:
        count = registry.shard_count() or 1
    except (RegistryError, OAIPMHDagsterError, sa.exc.SQLAlchemyError):
        count = 1
    for group in shard_groups(ids, count):
        ok, message = reload_code_location(timeout=300.0, harvester_id=group[0],
                                           location=locate(group[0]))
        done.reloads += 1
        done.lines.append(Line(message, note=not ok))
