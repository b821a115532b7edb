"""Harvesters that turned bad since the alert sensor last looked: `raw_records` whose
freshness turned FAIL (Dagster's freshness daemon records the state), and asset checks
whose latest evaluation failed. Read in two batch queries per tick; which
harvesters are bad already is the alert cursor's `failing` list, so a harvester that stays
bad is reported once, and again only after it has recovered and failed anew."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC

import dagster as dg

from oaipmh_dagster.contracts import (
    ASSET_PREFIX,
    CHECK_COMPLETE,
    CHECK_NO_FAILED,
    CHECK_SCHEMA_VALID,
)
from oaipmh_dagster.defs.assets import asset_keys

__all__ = ["FRESHNESS", "Health", "Transition", "failing_now", "transitions"]

FRESHNESS = "freshness"  # the failing list's name for a freshness FAIL (checks: their name)
_FAILED = "FAILED"  # AssetCheckExecutionRecordStatus.FAILED: the check did not pass
_PLANNED = "PLANNED"  # AssetCheckExecutionRecordStatus.PLANNED: being evaluated
_FAIL = "FAIL"  # FreshnessState.FAIL


@dataclass(frozen=True)
class Transition:
    """One harvester turned bad: `what` is FRESHNESS or a check's name."""

    harvester: str
    what: str
    asset: dg.AssetKey
    detail: str

    @property
    def key(self) -> str:
        """Its entry in the cursor's `failing` list."""
        return f"{self.harvester}/{self.what}"


def _check_keys(ids: Iterable[str],
                more: Iterable[dg.AssetCheckKey] = ()) -> dict[dg.AssetCheckKey, str]:
    """Every check of the harvesters `ids` (a harvester that does not validate has no
    schema_valid evaluations: its key finds nothing), to the harvester; with those of
    `more` that are on one of their assets (a user's own checks)."""
    keys: dict[dg.AssetCheckKey, str] = {}
    for hid in ids:
        _, raw, records = asset_keys(hid)
        keys[dg.AssetCheckKey(records, CHECK_NO_FAILED)] = hid
        keys[dg.AssetCheckKey(raw, CHECK_COMPLETE)] = hid
        keys[dg.AssetCheckKey(raw, CHECK_SCHEMA_VALID)] = hid
    wanted = set(ids)
    for key in more:
        path = key.asset_key.path
        if len(path) >= 2 and path[0] == ASSET_PREFIX and path[1] in wanted:
            keys[key] = path[1]
    return keys


def _check_detail(evaluation: dg.AssetCheckEvaluation | None) -> str:
    """The failed evaluation in a line: severity, description, simple metadata."""
    if evaluation is None:
        return "failed"
    parts = [f"failed ({evaluation.severity.value.lower()})"]
    if evaluation.description:
        parts.append(evaluation.description)
    for name, value in sorted(evaluation.metadata.items()):
        shown = getattr(value, "value", value)
        if isinstance(shown, (str, int, float)) and not isinstance(shown, bool):
            parts.append(f"{name}: {shown}")
    return "; ".join(parts)


def _failed_checks(instance: dg.DagsterInstance, ids: Sequence[str],
                   more: Iterable[dg.AssetCheckKey] = ()) -> tuple[list[Transition], set[str]]:
    """Checks whose latest evaluation failed, and those being evaluated now (their
    outcome unknown yet: in one batch query the latest execution may be only planned)."""
    keys = _check_keys(ids, more)
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(list(keys))
    failed, pending = [], set()
    for key, record in latest.items():
        if record.status.value == _PLANNED:
            pending.add(f"{keys[key]}/{key.name}")
        elif record.status.value == _FAILED:
            evaluation = record.event.asset_check_evaluation if record.event else None
            failed.append(Transition(keys[key], key.name, key.asset_key,
                                     _check_detail(evaluation)))
    return failed, pending


def _freshness_fails(instance: dg.DagsterInstance, ids: Sequence[str]) -> list[Transition]:
    raw = {asset_keys(hid)[1]: hid for hid in ids}
    out = []
    for key, record in instance.get_freshness_state_records(list(raw)).items():
        if record.freshness_state.value != _FAIL or key not in raw:
            continue
        since = record.updated_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        out.append(Transition(raw[key], FRESHNESS, key,
                              f"freshness FAIL since {since}: no successful harvest "
                              "within two periods of its schedule"))
    return out


@dataclass(frozen=True)
class Health:
    """The harvesters bad now (stable order) and the checks whose outcome is not known
    yet (`harvester/check`: being evaluated)."""

    bad: list[Transition]
    pending: set[str]

    def keeps(self, key: str) -> bool:
        """Whether a harvester known bad (`key`) is still, or may still be, bad."""
        return key in self.pending or any(t.key == key for t in self.bad)


def failing_now(instance: dg.DagsterInstance, ids: Sequence[str],
                checks: Iterable[dg.AssetCheckKey] = ()) -> Health:
    """The freshness and checks of the harvesters `ids`, in two batch queries: the
    built-in checks and those of `checks` on their assets (the code location's)."""
    if not ids:
        return Health([], set())
    failed, pending = _failed_checks(instance, ids, checks)
    bad = sorted(_freshness_fails(instance, ids) + failed, key=lambda t: t.key)
    return Health(bad, pending)


def transitions(now: Sequence[Transition], failing: Iterable[str]) -> list[Transition]:
    """Those of `now` not already in the cursor's `failing` list."""
    known = set(failing)
    return [t for t in now if t.key not in known]
