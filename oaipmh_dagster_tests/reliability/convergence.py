"""A loopback server's data set that changes between harvest rounds, with the history
of every record's versions, and what a store must hold to equal it.

A record's *version* is (datestamp in the store's UTC form, deleted, sets, revision):
the revision is the `rev-N` marker this module writes into the metadata of every record
it adds or changes (None for generated records and tombstones), so a change that keeps
the datestamp (two changes on one day at day granularity) is still seen."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from oaipmh_dagster.demo.dataset import DAY, SECONDS, Dataset, ServedRecord, make_dataset
from oaipmh_dagster.harvesting.incremental import default_overlap
from oaipmh_dagster.oai import Granularity
from oaipmh_dagster.storage.store import Store, utc_datestamp

Version = tuple[str, bool, tuple[str, ...], str | None]

# The server's clock starts here (in the past: a responseDate ahead of the local clock
# is not trusted) and only moves forward; generated records are dated 2019-2024.
BASE = datetime(2026, 1, 1, tzinfo=UTC)
PREFIX = "oai_dc"
# Memberships of make_dataset(sets=4): each record sits in one leaf (plus its parents).
MEMBERSHIPS: tuple[tuple[str, ...], ...] = (
    ("datasets",), ("theses",), ("publications", "publications:articles"),
)
# Harvester selections: everything, one set, a parent set, two sets.
SELECTIONS: tuple[tuple[str, ...], ...] = (
    (), ("datasets",), ("publications",), ("theses", "datasets"), ("publications", "theses"),
)
_REV = re.compile(r"rev-(\d+)")
DC = ('<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
      'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{title}</dc:title>'
      "<dc:identifier>{identifier}</dc:identifier></oai_dc:dc>")


@dataclass(frozen=True)
class Profile:
    """What one seed varies: the server, the harvester and how many rounds."""

    seed: int
    granularity: str
    snapshot_lists: bool
    max_parallel: int
    sets: tuple[str, ...]
    records: int
    rounds: int
    # From how many records still to come a list moves to a worker process
    # (`$OAIPMH_HARVEST_WORKER`); None: the default, which lists this short never reach.
    worker: int | None = None


def profile(seed: int, rounds: int) -> Profile:
    """The profile of `seed`: any four consecutive seeds from a multiple of four cover
    every pair of granularity, snapshot lists and sequential/windowed (eight cover every
    combination); the harvester's sets cycle through the selections; the size is drawn
    from the seed; one sequential seed in four moves its lists to a worker process."""
    rng = random.Random(f"profile-{seed}")
    day, snapshot = seed % 2, seed // 2 % 2
    windowed = (day + snapshot + seed // 4) % 2
    return Profile(
        seed=seed,
        granularity=(SECONDS, DAY)[day],
        snapshot_lists=bool(snapshot),
        max_parallel=1 if not windowed else rng.choice((2, 3)),
        sets=SELECTIONS[seed % len(SELECTIONS)],
        records=rng.randint(120, 240),
        rounds=rounds,
        worker=40 if not windowed and seed % 4 == 3 else None,
    )


def revision(raw_xml: str | None) -> str | None:
    """The `rev-N` marker in a record's metadata XML (None without one)."""
    found = _REV.search(raw_xml or "")
    return found.group(0) if found else None


def in_selection(record: ServedRecord, sets: Iterable[str]) -> bool:
    """Whether a harvest of `sets` (empty: all) in oai_dc lists `record`."""
    sets = tuple(sets)
    if sets and not any(record.in_set(s) for s in sets):
        return False
    return record.deleted or PREFIX in record.metadata


class World:
    """The server's data set, its clock, and every version each record ever had."""

    def __init__(self, p: Profile) -> None:
        self.rng = random.Random(p.seed)
        self.dataset: Dataset = make_dataset(p.records, seed=p.seed, sets=4,
                                             granularity=p.granularity, deleted_ratio=0.08)
        self.granularity = Granularity(p.granularity)
        self.overlap = default_overlap(self.granularity)
        self.clock = BASE
        self.previous = BASE
        self.round = 0
        self.revisions: dict[str, str] = {}  # identifier -> rev-N of records written here
        self.changed_in: dict[str, int] = {}  # identifier -> round of its last change
        self.history: dict[str, set[Version]] = {}
        self._next = 0
        for rec in self.dataset:
            self._remember(rec.identifier)

    # -- versions -----------------------------------------------------------------------

    def version(self, rec: ServedRecord) -> Version:
        rev = None if rec.deleted else self.revisions.get(rec.identifier)
        return (utc_datestamp(rec.datestamp), rec.deleted, tuple(rec.sets), rev)

    def _remember(self, identifier: str) -> None:
        rec = self.dataset.get(identifier)
        assert rec is not None
        self.history.setdefault(identifier, set()).add(self.version(rec))
        self.changed_in[identifier] = self.round

    def expected(self, sets: Iterable[str]) -> dict[str, Version]:
        """identifier -> version of every record a harvest of `sets` lists now."""
        sets = tuple(sets)
        return {r.identifier: self.version(r) for r in self.dataset if in_selection(r, sets)}

    # -- time -----------------------------------------------------------------------------

    def advance(self) -> None:
        """The next round: the server's clock moves on (minutes at seconds granularity,
        hours at day granularity, so some rounds share a day), never past our clock."""
        self.round += 1
        if self.round == 1:
            return
        self.previous = self.clock
        if self.granularity == Granularity.DAY:
            step = timedelta(hours=self.rng.randint(3, 30))
        else:
            step = timedelta(minutes=self.rng.randint(2, 40))
        self.clock += step
        assert self.clock <= datetime.now(UTC)

    def stamp(self) -> datetime:
        """A datestamp for a change of this round: mostly between the previous clock and
        this one, some trailing the previous clock by less than the overlap (stamped
        before the responseDate of the last harvest, visible only after it)."""
        if self.rng.random() < 0.3:
            back = self.rng.uniform(0, 0.95 * self.overlap.total_seconds())
            return self.previous - timedelta(seconds=back)
        span = (self.clock - self.previous).total_seconds()
        return self.previous + timedelta(seconds=self.rng.uniform(0, span))

    # -- changes --------------------------------------------------------------------------

    def _metadata(self, identifier: str) -> dict[str, str]:
        self._next += 1
        rev = f"rev-{self._next}"
        self.revisions[identifier] = rev
        return {PREFIX: DC.format(title=f"{identifier} {rev}", identifier=identifier)}

    def mutate(self, changes: int) -> list[str]:
        """Apply `changes` random changes; return what was done (for failure messages)."""
        done = []
        for _ in range(changes):
            kind = self.rng.choices(("add", "change", "delete", "move", "resurrect"),
                                    weights=(3, 4, 2, 2, 1))[0]
            done.append(getattr(self, f"_{kind}")())
        return [d for d in done if d]

    def _pick(self, deleted: bool) -> ServedRecord | None:
        pool = [r for r in self.dataset.records if r.deleted == deleted]
        return self.rng.choice(pool) if pool else None

    def _add(self) -> str:
        identifier = f"oai:demo.example.org:new-{self.round}-{self._next + 1}"
        sets = self.rng.choice(MEMBERSHIPS)
        self.dataset.add(ServedRecord(identifier, self.stamp(), sets,
                                      metadata=self._metadata(identifier)))
        self._remember(identifier)
        return f"add {identifier}"

    def _change(self) -> str | None:
        rec = self._pick(deleted=False)
        if rec is None:
            return None
        self.dataset.upsert(ServedRecord(rec.identifier, self.stamp(), rec.sets,
                                         metadata=self._metadata(rec.identifier)))
        self._remember(rec.identifier)
        return f"change {rec.identifier}"

    def _delete(self) -> str | None:
        rec = self._pick(deleted=False)
        if rec is None:
            return None
        self.dataset.delete(rec.identifier, when=self.stamp())
        self._remember(rec.identifier)
        return f"delete {rec.identifier}"

    def _move(self) -> str | None:
        rec = self._pick(deleted=False)
        if rec is None:
            return None
        sets = self.rng.choice([m for m in MEMBERSHIPS if m != rec.sets])
        self.dataset.upsert(ServedRecord(rec.identifier, self.stamp(), sets,
                                         metadata=rec.metadata))
        self._remember(rec.identifier)
        return f"move {rec.identifier} {rec.sets} -> {sets}"

    def _resurrect(self) -> str | None:
        rec = self._pick(deleted=True)
        if rec is None:
            return None
        self.dataset.upsert(ServedRecord(rec.identifier, self.stamp(), rec.sets,
                                         metadata=self._metadata(rec.identifier)))
        self._remember(rec.identifier)
        return f"resurrect {rec.identifier}"


def stored(store: Store, harvester_id: str) -> dict[str, Version]:
    """identifier -> version of what the store holds (the snapshot plus the revision
    marker of the stored raw XML)."""
    snap = store.snapshot(harvester_id)
    revs = {item["oai_identifier"]: revision(item.get("raw_xml"))
            for item in store.iter_records(harvester_id, with_raw=True)}
    return {k: (d, deleted, sets, None if deleted else revs.get(k))
            for k, (d, deleted, sets) in snap.items()}


def differences(actual: dict[str, Version], expected: dict[str, Version],
                keys: Iterable[str]) -> dict[str, tuple]:
    """identifier -> (stored, served) for each of `keys` where they differ."""
    return {k: (actual.get(k), expected.get(k)) for k in keys
            if actual.get(k) != expected.get(k)}
