"""A request's arguments checked against its verb: the protocol's badVerb and
badArgument, and the from/until bounds."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from oaipmh_dagster.storage.registry import PREFIX_PATTERN, SET_SPEC_PATTERN


class ProtocolError(Exception):
    """An OAI-PMH error response: `code` is the protocol's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# verb -> (required, optional); resumptionToken is exclusive.
VERBS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "Identify": (frozenset(), frozenset()),
    "ListMetadataFormats": (frozenset(), frozenset({"identifier"})),
    "ListSets": (frozenset(), frozenset({"resumptionToken"})),
    "GetRecord": (frozenset({"identifier", "metadataPrefix"}), frozenset()),
    "ListIdentifiers": (frozenset({"metadataPrefix"}),
                        frozenset({"from", "until", "set", "resumptionToken"})),
    "ListRecords": (frozenset({"metadataPrefix"}),
                    frozenset({"from", "until", "set", "resumptionToken"})),
}
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_SECOND = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def bad(message: str) -> ProtocolError:
    return ProtocolError("badArgument", message)


def parse(pairs: Sequence[tuple[str, str]]) -> tuple[str, dict[str, str]]:
    """(verb, arguments) of a request's query or form pairs."""
    verbs = [v for k, v in pairs if k == "verb"]
    if not verbs:
        raise ProtocolError("badVerb", "the request has no verb argument")
    if len(verbs) > 1:
        raise ProtocolError("badVerb", "the verb argument is repeated")
    verb = verbs[0]
    if verb not in VERBS:
        raise ProtocolError("badVerb", f"{verb!r} is not an OAI-PMH verb")
    args: dict[str, str] = {}
    for key, value in pairs:
        if key == "verb":
            continue
        if key in args:
            raise bad(f"the argument {key} is repeated")
        args[key] = value
    required, optional = VERBS[verb]
    unknown = sorted(set(args) - required - optional)
    if unknown:
        raise bad(f"{verb} takes no argument {', '.join(unknown)}")
    if "resumptionToken" in args:
        if len(args) > 1:
            raise bad("resumptionToken is an exclusive argument")
    else:
        missing = sorted(required - set(args))
        if missing:
            raise bad(f"{verb} needs the argument {', '.join(missing)}")
    if "metadataPrefix" in args and not PREFIX_PATTERN.fullmatch(args["metadataPrefix"]):
        raise bad(f"{args['metadataPrefix']!r} is not a metadata prefix")
    if "set" in args and not SET_SPEC_PATTERN.fullmatch(args["set"]):
        raise bad(f"{args['set']!r} is not a setSpec")
    if "identifier" in args and not args["identifier"].strip():
        raise bad("the identifier is empty")
    return verb, args


@dataclass(frozen=True)
class Window:
    """The change times a list asks for: [lower, upper), either end open."""

    lower: datetime | None
    upper: datetime | None


def _instant(name: str, value: str) -> tuple[datetime, bool]:
    """A from/until value as (its first instant, day granularity)."""
    try:
        if _DAY.fullmatch(value):
            return datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC), True
        if _SECOND.fullmatch(value):
            return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC), False
    except ValueError:
        pass
    raise bad(f"{name} {value!r} is neither YYYY-MM-DD nor YYYY-MM-DDThh:mm:ssZ")


def window(args: dict[str, str]) -> Window:
    """from/until as bounds: both inclusive at their granularity, so until=2024-05-01
    takes the whole day; mixed granularities and from after until are badArgument."""
    lower = upper = None
    day_from = day_until = None
    if "from" in args:
        lower, day_from = _instant("from", args["from"])
    if "until" in args:
        start, day_until = _instant("until", args["until"])
        upper = start + (timedelta(days=1) if day_until else timedelta(seconds=1))
        if lower is not None and lower > start:
            raise bad("from is later than until")
    if day_from is not None and day_until is not None and day_from != day_until:
        raise bad("from and until have different granularities")
    return Window(lower, upper)
