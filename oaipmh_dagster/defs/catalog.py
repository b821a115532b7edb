"""What the asset catalog filters a harvester's assets by: tags naming the endpoint's
host, the metadata prefix and the set, and the owners named by `OAIPMH_ASSET_OWNERS`.

Dagster's asset tag values hold at most 63 letters, digits, `_`, `-` and `.`: other
characters become `_` (`127.0.0.1:8765` -> `127.0.0.1_8765`), and a longer value keeps
its first 54 characters and a hash of the whole."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re

import dagster as dg

from oaipmh_dagster.contracts import HOST_TAG
from oaipmh_dagster.storage.registry import Harvester

__all__ = ["OWNERS_ENV", "PREFIX_TAG", "SET_TAG", "asset_owners", "asset_tags", "tag_value"]

log = logging.getLogger(__name__)

PREFIX_TAG = "oaipmh/prefix"
SET_TAG = "oaipmh/set"
# Comma-separated owners of every harvester's assets: e-mail addresses or `team:<name>`.
OWNERS_ENV = "OAIPMH_ASSET_OWNERS"
# The `oaipmh/set` value of a harvester of the whole repository, and of several sets
# (the source asset's description and metadata list them).
ALL_SETS = "all"
SEVERAL_SETS = "several"

_INVALID = re.compile(r"[^A-Za-z0-9_.-]")
_MAX = 63


def tag_value(text: str) -> str:
    """`text` as a valid asset tag value."""
    value = _INVALID.sub("_", text)
    if len(value) <= _MAX:
        return value
    digest = hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
    return f"{value[:_MAX - 9]}_{digest}"


def asset_tags(h: Harvester) -> dict[str, str]:
    """The tags of each of `h`'s assets."""
    if not h.sets:
        sets = ALL_SETS
    elif len(h.sets) == 1:
        sets = tag_value(h.sets[0])
    else:
        sets = SEVERAL_SETS
    return {HOST_TAG: tag_value(h.host), PREFIX_TAG: tag_value(h.metadata_prefix),
            SET_TAG: sets}


def asset_owners() -> list[str]:
    """The owners from `OAIPMH_ASSET_OWNERS`; one Dagster refuses is left out with an error
    in the log (it would fail the whole code location)."""
    return list(_owners(os.environ.get(OWNERS_ENV, "")))


@functools.cache
def _owners(text: str) -> tuple[str, ...]:
    out = []
    for owner in filter(None, (part.strip() for part in text.split(","))):
        try:
            dg.AssetSpec("owner_check", owners=[owner])
        except dg.DagsterInvalidDefinitionError:
            log.error("%s: %r is neither an e-mail address nor team:<name>; left out",
                      OWNERS_ENV, owner)
            continue
        out.append(owner)
    return tuple(out)
