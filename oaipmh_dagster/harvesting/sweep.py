"""Sweeps: tombstoning stored records the server did not report deleted (a reconcile's
unlisted records; the records a changed selection left behind), and the cap that keeps a
broken server from emptying the store.

A sweep that would tombstone more than the harvester's `max_delete` allows (a share of
its live records, default 10 %, or a count) tombstones nothing unless the run confirms
(`allow_mass_delete`): it is *held back*, and the harvest fails saying so (`HeldBack`).

The selection sweep: a harvest state keeps the fingerprint (`incremental.scope`) of the
selection whose records the store holds. After `harvester update` of the URL, prefix or
sets it differs from the harvester's, and the first full harvest of the new selection
read in one run, whole, collects the identifiers it saw and then tombstones the live
records it did not see. No Dagster in here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from oaipmh_dagster.storage.ports import RecordStore
from oaipmh_dagster.storage.registry import DeleteLimit, Harvester

OUTSIDE = "not in the harvester's selection (its URL, prefix or sets changed)"
CONFIRM = ("run again with --allow-mass-delete (run config allow_mass_delete: true), or "
           "raise the harvester's max_delete (harvester update --max-delete)")


@dataclass(frozen=True)
class HeldBack:
    """A sweep that would have tombstoned more than the harvester's limit allows."""

    sweep: str  # reconcile | selection
    harvester_id: str
    would_tombstone: int
    live: int
    limit: int
    max_delete: str
    why: str  # which records, in words

    def message(self) -> str:
        """What was held back and how to confirm, in one line."""
        return (f"{self.sweep} sweep held back: it would tombstone {self.would_tombstone} of "
                f"the {self.live} live records of {self.harvester_id} ({self.why}), more than "
                f"max_delete {self.max_delete} allows ({self.limit}); nothing was tombstoned. "
                f"If that is right, {CONFIRM}")

    def metadata(self) -> dict[str, Any]:
        """The materialization metadata that shows it."""
        return {"oai/sweep": self.sweep, "oai/sweep_would_tombstone": self.would_tombstone,
                "oai/sweep_live": self.live, "oai/sweep_limit": self.limit,
                "oai/max_delete": self.max_delete, "oai/sweep_confirm": CONFIRM}


def check(sweep: str, h: Harvester, would: int, live: int, why: str, *,
          allow: bool) -> HeldBack | None:
    """The hold on a sweep of `h` that would tombstone `would` of `live` records (None:
    it may go ahead, being within the limit or confirmed)."""
    limit = DeleteLimit.parse(h.max_delete).allowed(live)
    if allow or would <= limit:
        return None
    return HeldBack(sweep, h.id, would, live, limit, h.max_delete, why)


def pending(saved: str | None, scope: str) -> bool:
    """Whether the store holds records of another selection than `scope` (`saved`: the
    harvest state's; None: unknown, taken to be this one)."""
    return saved is not None and saved != scope


def sweep_selection(
    store: RecordStore, h: Harvester, seen: Iterable[str] | set[str], *, run_id: str,
    allow: bool, logger: Any,
) -> tuple[int, HeldBack | None]:
    """Tombstone the live records of `h` that a complete harvest of its selection did not
    see (`seen`), under the cap: (how many were tombstoned, the hold when held back)."""
    seen = seen if isinstance(seen, set) else set(seen)
    live = 0
    outside = []
    for identifier in store.live_identifiers(h.id):
        live += 1
        if identifier not in seen:
            outside.append(identifier)
    held = check("selection", h, len(outside), live,
                 "not found by the complete harvest of its new selection", allow=allow)
    if held is not None:
        logger.error(held.message())
        return 0, held
    done = store.tombstone_unlisted(h.id, outside, reason=OUTSIDE, run_id=run_id,
                                    location="selection") if outside else 0
    logger.info("selection sweep: %d live records outside the new selection tombstoned", done)
    return done, None
