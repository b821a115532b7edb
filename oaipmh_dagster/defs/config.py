"""Run configuration of a harvest (the launchpad form)."""

from __future__ import annotations

import dagster as dg
from pydantic import Field


class HarvestConfig(dg.Config):
    """How one run of `harvest_oaipmh_records_<id>` harvests. Defaults: incremental."""

    since: str | None = Field(
        default=None,
        description=(
            "Harvest records changed on or after this date (YYYY-MM-DD or an ISO 8601 "
            "datetime, UTC unless it has an offset). Empty: the last successful harvest's "
            "server date (the since sensor's cursor), or everything on the first run."
        ),
    )
    until: str | None = Field(
        default=None,
        description=("Harvest records changed on or before this date (a day without a time: "
                     "up to its end, 23:59:59Z). Empty: up to now."),
    )
    full: bool = Field(
        default=False,
        description="Ignore the remembered since and harvest the whole repository.",
    )
    oai_ids: list[str] = Field(
        default_factory=list,
        description="Re-harvest exactly these OAI identifiers with GetRecord (nothing else).",
    )
    sets: list[str] | None = Field(
        default=None,
        description="Harvest these sets instead of the harvester's own (empty list: all).",
    )
    resume: bool = Field(
        default=True,
        description=(
            "Continue an interrupted harvest of this harvester from its last committed page "
            "when its resumption token is still accepted."
        ),
    )
    reconcile: bool | None = Field(
        default=None,
        description=(
            "After harvesting, list every identifier of the harvester's selection and "
            "compare with the store: fetch what is missing or stale, tombstone what the "
            "server no longer lists. Empty: only on the scheduled runs the harvester's "
            "reconcile_every asks for. Not with oai_ids, until or other sets."
        ),
    )
    allow_mass_delete: bool = Field(
        default=False,
        description=(
            "Let a sweep tombstone more records than the harvester's max_delete allows: a "
            "reconcile's records the server no longer lists, or, after a changed URL, "
            "prefix or sets, the records the first complete harvest did not find. "
            "Without it such a sweep tombstones nothing and the run fails saying so."
        ),
    )
