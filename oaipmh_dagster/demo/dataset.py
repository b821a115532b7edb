"""The records a demo OAI-PMH server serves, and a generator of realistic samples.

A :class:`Dataset` is an in-memory repository: records kept sorted by
``(datestamp, identifier)``, sets, metadata formats and the Identify fields.
:func:`make_dataset` fills one deterministically from a seed; the metadata of
generated records is rendered on demand (``oai_dc`` and DataCite kernel-4 views of
the same work), so large data sets stay small in memory.
"""

from __future__ import annotations

import bisect
import hashlib
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time
from typing import Any
from xml.sax.saxutils import quoteattr

__all__ = [
    "DAY",
    "DEFAULT_FORMATS",
    "SECONDS",
    "Dataset",
    "MetadataFormat",
    "ServedRecord",
    "make_dataset",
]

DAY = "YYYY-MM-DD"
SECONDS = "YYYY-MM-DDThh:mm:ssZ"

OAI_DC_NS = "http://www.openarchives.org/OAI/2.0/oai_dc/"
DC_NS = "http://purl.org/dc/elements/1.1/"
DATACITE_NS = "http://datacite.org/schema/kernel-4"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"

MetadataFormat = tuple[str, str, str]
"""``(metadataPrefix, schema URL, metadata namespace)``."""

DEFAULT_FORMATS: tuple[MetadataFormat, ...] = (
    ("oai_dc", "http://www.openarchives.org/OAI/2.0/oai_dc.xsd", OAI_DC_NS),
    ("datacite", "http://schema.datacite.org/meta/kernel-4/metadata.xsd", DATACITE_NS),
)


@dataclass(slots=True)
class ServedRecord:
    """One item as the repository serves it.

    ``metadata`` maps a metadataPrefix to the XML text of the metadata root element;
    a deleted record (a tombstone) has none.
    """

    identifier: str
    datestamp: datetime
    sets: tuple[str, ...] = ()
    deleted: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[datetime, str]:
        """The sort key: ``(datestamp, identifier)``."""
        return (self.datestamp, self.identifier)

    def in_set(self, spec: str) -> bool:
        """True when the record belongs to ``spec`` or to a set below it."""
        prefix = spec + ":"
        return any(s == spec or s.startswith(prefix) for s in self.sets)


def escape(text: str) -> str:
    """``text`` escaped for XML character data."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _record_key(record: ServedRecord) -> tuple[datetime, str]:
    return (record.datestamp, record.identifier)


def _as_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class Dataset:
    """A thread-safe in-memory OAI-PMH repository."""

    def __init__(
        self,
        *,
        repository_name: str = "Demo Research Repository",
        granularity: str = SECONDS,
        earliest_datestamp: datetime | None = None,
        deleted_record: str = "persistent",
        admin_email: str = "oai-admin@demo.example.org",
        repository_identifier: str = "demo.example.org",
        sets: Mapping[str, str] | None = None,
        formats: list[MetadataFormat] | None = None,
        records: list[ServedRecord] | None = None,
    ) -> None:
        if granularity not in (DAY, SECONDS):
            raise ValueError(f"granularity must be {DAY!r} or {SECONDS!r}, not {granularity!r}")
        if deleted_record not in ("no", "persistent", "transient"):
            raise ValueError(
                f"deleted_record must be no, persistent or transient: {deleted_record!r}"
            )
        self.repository_name = repository_name
        self.granularity = granularity
        self.deleted_record = deleted_record
        self.admin_email = admin_email
        self.repository_identifier = repository_identifier
        self.sets: dict[str, str] = dict(sets or {})
        self.formats: list[MetadataFormat] = list(formats or DEFAULT_FORMATS)
        self._earliest = _as_utc(earliest_datestamp) if earliest_datestamp else None
        self._lock = threading.RLock()
        self._records: list[ServedRecord] = []
        self._by_id: dict[str, ServedRecord] = {}
        self._version = 0
        self._cache: dict[tuple[object, ...], tuple[ServedRecord, ...]] = {}
        if records:
            self.extend(records)

    # -- properties ---------------------------------------------------------------

    @property
    def earliest_datestamp(self) -> datetime:
        """The set value, else the oldest record's datestamp (epoch when empty)."""
        if self._earliest is not None:
            return self.normalize(self._earliest)
        with self._lock:
            if self._records:
                return self._records[0].datestamp
        return datetime(1970, 1, 1, tzinfo=UTC)

    @earliest_datestamp.setter
    def earliest_datestamp(self, value: datetime | None) -> None:
        self._earliest = _as_utc(value) if value else None

    @property
    def prefixes(self) -> list[str]:
        """The metadataPrefixes the repository supports."""
        return [f[0] for f in self.formats]

    @property
    def version(self) -> int:
        """A counter bumped on every change."""
        return self._version

    @property
    def records(self) -> list[ServedRecord]:
        """A snapshot of every record, in ``(datestamp, identifier)`` order."""
        with self._lock:
            return list(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[ServedRecord]:
        return iter(self.records)

    # -- datestamps ---------------------------------------------------------------

    def normalize(self, value: datetime) -> datetime:
        """``value`` in UTC, cut to the repository's granularity."""
        value = _as_utc(value).replace(microsecond=0)
        if self.granularity == DAY:
            value = value.replace(hour=0, minute=0, second=0)
        return value

    def format_datestamp(self, value: datetime) -> str:
        """``value`` as the repository writes datestamps."""
        value = self.normalize(value)
        # %Y is not zero-padded before year 1000; the protocol wants four digits.
        if self.granularity == DAY:
            return f"{value.year:04d}" + value.strftime("-%m-%d")
        return f"{value.year:04d}" + value.strftime("-%m-%dT%H:%M:%SZ")

    # -- changes ------------------------------------------------------------------

    def _changed(self) -> None:
        self._version += 1
        self._cache.clear()

    def _insert(self, record: ServedRecord) -> None:
        record = replace(
            record, datestamp=self.normalize(record.datestamp), sets=tuple(record.sets)
        )
        bisect.insort(self._records, record, key=_record_key)
        self._by_id[record.identifier] = record

    def _remove(self, record: ServedRecord) -> None:
        i = bisect.bisect_left(self._records, record.key, key=_record_key)
        while self._records[i].identifier != record.identifier:
            i += 1
        del self._records[i]
        del self._by_id[record.identifier]

    def add(self, record: ServedRecord) -> None:
        """Add a new record; ``ValueError`` when its identifier exists."""
        with self._lock:
            if record.identifier in self._by_id:
                raise ValueError(f"record exists: {record.identifier}")
            self._insert(record)
            self._changed()

    def extend(self, records: list[ServedRecord]) -> None:
        """Add many new records at once (one sort)."""
        with self._lock:
            fresh: list[ServedRecord] = []
            for record in records:
                if record.identifier in self._by_id:
                    raise ValueError(f"record exists: {record.identifier}")
                record = replace(
                    record, datestamp=self.normalize(record.datestamp), sets=tuple(record.sets)
                )
                self._by_id[record.identifier] = record
                fresh.append(record)
            self._records.extend(fresh)
            self._records.sort(key=_record_key)
            self._changed()

    def upsert(self, record: ServedRecord) -> None:
        """Add ``record`` or replace the record with its identifier."""
        with self._lock:
            old = self._by_id.get(record.identifier)
            if old is not None:
                self._remove(old)
            self._insert(record)
            self._changed()

    def delete(self, identifier: str, when: datetime | None = None) -> ServedRecord:
        """Turn a record into a tombstone dated ``when`` (default now); return it."""
        with self._lock:
            old = self._by_id.get(identifier)
            if old is None:
                raise KeyError(identifier)
            tomb = ServedRecord(
                identifier=identifier,
                datestamp=when or datetime.now(UTC),
                sets=old.sets,
                deleted=True,
            )
            self._remove(old)
            self._insert(tomb)
            self._changed()
            return self._by_id[identifier]

    def get(self, identifier: str) -> ServedRecord | None:
        """The record with ``identifier``, or None."""
        with self._lock:
            return self._by_id.get(identifier)

    # -- queries ------------------------------------------------------------------

    def disseminates(self, record: ServedRecord, prefix: str) -> bool:
        """True when ``record`` can be listed in format ``prefix``."""
        if record.deleted:
            return prefix in self.prefixes
        return prefix in record.metadata

    def _bounds(
        self, from_: datetime | date | None, until: datetime | date | None
    ) -> tuple[datetime | None, datetime | None]:
        low = high = None
        day = self.granularity == DAY
        if from_ is not None:
            if not isinstance(from_, datetime):
                from_ = datetime.combine(from_, time(), UTC)
            low = _as_utc(from_)
            if day:
                low = low.replace(hour=0, minute=0, second=0, microsecond=0)
        if until is not None:
            if not isinstance(until, datetime):
                until = datetime.combine(until, time(23, 59, 59, 999999), UTC)
            high = _as_utc(until)
            if day:
                high = high.replace(hour=23, minute=59, second=59, microsecond=999999)
        return low, high

    def select_view(
        self,
        prefix: str | None = None,
        from_: datetime | date | None = None,
        until: datetime | date | None = None,
        set_spec: str | None = None,
    ) -> tuple[ServedRecord, ...]:
        """Like :meth:`select`, as a cached tuple (shared: do not rely on identity)."""
        low, high = self._bounds(from_, until)
        cache_key = (prefix, low, high, set_spec)
        with self._lock:
            hit = self._cache.get(cache_key)
            if hit is not None:
                return hit
            records = self._records
            start = (
                0 if low is None else bisect.bisect_left(records, low, key=lambda r: r.datestamp)
            )
            stop = (
                len(records)
                if high is None
                else bisect.bisect_right(records, high, key=lambda r: r.datestamp)
            )
            chosen: list[ServedRecord] | tuple[ServedRecord, ...] = records[start:stop]
            if set_spec is not None:
                chosen = [r for r in chosen if r.in_set(set_spec)]
            if prefix is not None:
                if prefix not in self.prefixes:
                    chosen = []
                else:
                    chosen = [r for r in chosen if r.deleted or prefix in r.metadata]
            result = tuple(chosen)
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[cache_key] = result
            return result

    def select(
        self,
        prefix: str | None = None,
        from_: datetime | date | None = None,
        until: datetime | date | None = None,
        set_spec: str | None = None,
    ) -> list[ServedRecord]:
        """Records in ``prefix`` with ``from_ <= datestamp <= until`` in ``set_spec``.

        Bounds are inclusive and compared at the repository's granularity (whole
        days for ``YYYY-MM-DD``); a set spec matches its own records and those of
        the sets below it (``a`` matches ``a`` and ``a:b``).
        """
        return list(self.select_view(prefix, from_, until, set_spec))


# -- sample generation ------------------------------------------------------------

_SET_POOL: tuple[tuple[str, str], ...] = (
    ("publications", "Publications"),
    ("datasets", "Research data"),
    ("theses", "Theses and dissertations"),
    ("publications:articles", "Journal articles"),
    ("software", "Software"),
    ("publications:conference", "Conference papers"),
    ("theses:doctoral", "Doctoral theses"),
    ("reports", "Reports and working papers"),
    ("publications:books", "Books and chapters"),
    ("theses:master", "Master theses"),
    ("images", "Images and figures"),
    ("datasets:survey", "Survey data"),
)

_GIVEN = (
    "Anna",
    "Jan",
    "Eva",
    "Petr",
    "Lucie",
    "Tomáš",
    "Marie",
    "Jakub",
    "Sofia",
    "Liam",
    "Noah",
    "Emma",
    "Olivia",
    "Mateo",
    "Chloé",
    "Łukasz",
    "Zoë",
    "José",
    "Ingrid",
    "Kenji",
    "Aisha",
    "Wei",
    "Priya",
    "Oluwaseun",
    "Björn",
    "Elif",
    "Dmitri",
    "Hana",
    "Carlos",
    "Fatima",
)
_FAMILY = (
    "Novák",
    "Svobodová",
    "Dvořák",
    "Müller",
    "Smith",
    "García",
    "Rossi",
    "Kowalski",
    "Nguyen",
    "O'Brien",
    "Johansson",
    "Tanaka",
    "Okafor",
    "Patel",
    "Yılmaz",
    "Ivanova",
    "Schmidt",
    "Dubois",
    "Chen",
    "Andersen",
    "van der Berg",
    "Horváth",
    "Costa",
    "Kim",
    "Fischer",
    "Nowak",
    "Moreau",
    "Larsen",
    "Silva",
    "Hoffmann",
)
_AFFILIATIONS = (
    "Charles University",
    "Czech Technical University in Prague",
    "Masaryk University",
    "University of Oxford",
    "ETH Zürich",
    "Universidad de Barcelona",
    "Kyoto University",
    "University of Lagos",
    "Sorbonne Université",
    "Uppsala University",
    "CERN",
    "Max Planck Institute for Informatics",
    "Indian Institute of Science",
)
_TOPICS = (
    "soil moisture",
    "protein folding",
    "urban heat islands",
    "graph neural networks",
    "medieval manuscripts",
    "coral reef resilience",
    "quantum error correction",
    "language acquisition",
    "groundwater recharge",
    "solar cell degradation",
    "migration policy",
    "river sediment transport",
    "open peer review",
    "glacier mass balance",
    "antimicrobial resistance",
    "bird song dialects",
    "public transport demand",
    "dark matter halos",
    "wheat rust genomics",
    "citizen science",
    "sleep and memory",
    "Baroque music performance",
)
_METHODS = (
    "A longitudinal study of",
    "Measuring",
    "Modelling",
    "Rethinking",
    "New evidence on",
    "A dataset of",
    "Machine learning for",
    "Field observations of",
    "Mapping",
    "Uncertainty & bias in",
    "Towards reproducible",
    "Comparing methods for",
)
_CONTEXTS = (
    "in Central Europe",
    "across three decades",
    "under climate change",
    "in low-income settings",
    "from satellite imagery",
    "in the Alps",
    "at city scale",
    "with open data",
    "in historical archives",
    'in the "long tail"',
)
_SUBJECTS = (
    "Earth sciences",
    "Biology",
    "Computer science",
    "History",
    "Physics",
    "Linguistics",
    "Environmental science",
    "Economics",
    "Medicine",
    "Musicology",
    "Sociology",
    "Chemistry",
)
_LANGS = ("en", "en", "en", "en", "cs", "de", "fr", "es")
_RIGHTS = (
    (
        "Creative Commons Attribution 4.0 International",
        "https://creativecommons.org/licenses/by/4.0/legalcode",
    ),
    (
        "Creative Commons Zero v1.0 Universal",
        "https://creativecommons.org/publicdomain/zero/1.0/legalcode",
    ),
    (
        "Creative Commons Attribution Share Alike 4.0 International",
        "https://creativecommons.org/licenses/by-sa/4.0/legalcode",
    ),
    ("Restricted access", "info:eu-repo/semantics/restrictedAccess"),
)
_RELATIONS = ("IsSupplementTo", "IsCitedBy", "References", "IsPartOf", "IsVersionOf")
# (DC type, DataCite resourceTypeGeneral, resourceType text) by top-level set.
_KINDS: dict[str, tuple[str, str, str]] = {
    "publications": ("Text", "JournalArticle", "Journal article"),
    "datasets": ("Dataset", "Dataset", "Dataset"),
    "theses": ("Text", "Dissertation", "Doctoral thesis"),
    "software": ("Software", "Software", "Research software"),
    "reports": ("Text", "Report", "Working paper"),
    "images": ("Image", "Image", "Figure"),
    "": ("Text", "Text", "Other"),
}
PUBLISHER = "Demo Research Repository"


def _orcid(pick: Callable[[int], int]) -> str:
    """An ORCID-shaped identifier with a valid ISO 7064 11,2 check digit."""
    body = f"0000000{1 + pick(3)}{pick(10_000_000):07d}"
    total = 0
    for ch in body:
        total = (total + ord(ch) - 48) * 2
    check = (12 - total % 11) % 11
    s = body + ("X" if check == 10 else str(check))
    return f"https://orcid.org/{s[0:4]}-{s[4:8]}-{s[8:12]}-{s[12:16]}"


@dataclass(frozen=True, slots=True)
class _Work:
    title: str
    creators: tuple[tuple[str, str, str, str], ...]  # given, family, orcid, affiliation
    subjects: tuple[str, ...]
    description: str
    year: int
    kind: tuple[str, str, str]
    doi: str
    rights: tuple[str, str]
    related: tuple[tuple[str, str], ...]  # (relationType, DOI)
    language: str


def _work(seed: int, number: int, sets: tuple[str, ...], year: int) -> _Work:
    # 512 pseudo-random bits per work, drawn from as a mixed-radix number.
    digest = hashlib.blake2b(f"{seed}/{number}".encode(), digest_size=64).digest()
    bits = int.from_bytes(digest, "little")

    def pick(n: int) -> int:
        nonlocal bits
        bits, value = divmod(bits, n)
        return value

    def one(pool: tuple[Any, ...]) -> Any:
        return pool[pick(len(pool))]

    topic = one(_TOPICS)
    title = f"{one(_METHODS)} {topic} {one(_CONTEXTS)}"
    creators = tuple(
        (one(_GIVEN), one(_FAMILY), _orcid(pick), one(_AFFILIATIONS)) for _ in range(1 + pick(3))
    )
    subjects = tuple(dict.fromkeys([one(_SUBJECTS), topic, one(_SUBJECTS)]))
    top = sets[0].split(":")[0] if sets else ""
    description = (
        f"We report on {topic} {one(_CONTEXTS)}. "
        f"The work combines {one(_TOPICS)} with {one(_TOPICS)} "
        f"and releases all material under an open licence (n = {12 + pick(8989)})."
    )
    related = tuple(
        (one(_RELATIONS), f"10.5072/demo.{seed}.{1 + pick(max(number, 2))}") for _ in range(pick(3))
    )
    return _Work(
        title=title,
        creators=creators,
        subjects=subjects,
        description=description,
        year=year,
        kind=_KINDS.get(top, _KINDS[""]),
        doi=f"10.5072/demo.{seed}.{number}",
        rights=one(_RIGHTS),
        related=related,
        language=one(_LANGS),
    )


def render_oai_dc(work: _Work) -> str:
    """The ``oai_dc`` view of a work."""
    e = escape
    parts = [
        f'<oai_dc:dc xmlns:oai_dc="{OAI_DC_NS}" xmlns:dc="{DC_NS}" xmlns:xsi="{XSI_NS}" '
        f'xsi:schemaLocation="{OAI_DC_NS} http://www.openarchives.org/OAI/2.0/oai_dc.xsd">',
        f"<dc:title>{e(work.title)}</dc:title>",
    ]
    parts += [f"<dc:creator>{e(f'{fam}, {giv}')}</dc:creator>" for giv, fam, _, _ in work.creators]
    parts += [f"<dc:subject>{e(s)}</dc:subject>" for s in work.subjects]
    parts += [
        f"<dc:description>{e(work.description)}</dc:description>",
        f"<dc:publisher>{e(PUBLISHER)}</dc:publisher>",
        f"<dc:date>{work.year}</dc:date>",
        f"<dc:type>{e(work.kind[0])}</dc:type>",
        f"<dc:identifier>https://doi.org/{e(work.doi)}</dc:identifier>",
        f"<dc:language>{work.language}</dc:language>",
    ]
    parts += [f"<dc:relation>https://doi.org/{e(doi)}</dc:relation>" for _, doi in work.related]
    parts += [f"<dc:rights>{e(work.rights[0])}</dc:rights>", "</oai_dc:dc>"]
    return "".join(parts)


def render_datacite(work: _Work) -> str:
    """The DataCite kernel-4 view of a work."""
    e = escape
    parts = [
        f'<resource xmlns="{DATACITE_NS}" xmlns:xsi="{XSI_NS}" '
        f'xsi:schemaLocation="{DATACITE_NS} http://schema.datacite.org/meta/kernel-4/metadata.xsd">',
        f'<identifier identifierType="DOI">{e(work.doi)}</identifier>',
        "<creators>",
    ]
    for given, family, orcid, affiliation in work.creators:
        parts.append(
            f'<creator><creatorName nameType="Personal">{e(f"{family}, {given}")}</creatorName>'
            f"<givenName>{e(given)}</givenName><familyName>{e(family)}</familyName>"
            f'<nameIdentifier nameIdentifierScheme="ORCID" schemeURI="https://orcid.org">'
            f"{orcid}</nameIdentifier><affiliation>{e(affiliation)}</affiliation></creator>"
        )
    parts += [
        "</creators>",
        f'<titles><title xml:lang="{work.language}">{e(work.title)}</title></titles>',
        f"<publisher>{e(PUBLISHER)}</publisher>",
        f"<publicationYear>{work.year}</publicationYear>",
        f"<resourceType resourceTypeGeneral={quoteattr(work.kind[1])}>{e(work.kind[2])}</resourceType>",
        "<subjects>",
    ]
    parts += [f"<subject>{e(s)}</subject>" for s in work.subjects]
    parts += ["</subjects>", f"<language>{work.language}</language>"]
    if work.related:
        parts.append("<relatedIdentifiers>")
        parts += [
            f'<relatedIdentifier relatedIdentifierType="DOI" relationType="{rel}">{e(doi)}</relatedIdentifier>'
            for rel, doi in work.related
        ]
        parts.append("</relatedIdentifiers>")
    parts += [
        f"<rightsList><rights rightsURI={quoteattr(work.rights[1])}>{e(work.rights[0])}</rights></rightsList>",
        f'<descriptions><description descriptionType="Abstract">{e(work.description)}</description></descriptions>',
        "</resource>",
    ]
    return "".join(parts)


_RENDERERS = {"oai_dc": render_oai_dc, "datacite": render_datacite}


class GeneratedMetadata(Mapping[str, str]):
    """A read-only ``prefix -> XML`` mapping rendered on access from a seed."""

    __slots__ = ("_identifier", "_number", "_prefixes", "_seed", "_sets", "_year")

    def __init__(
        self,
        seed: int,
        number: int,
        identifier: str,
        sets: tuple[str, ...],
        year: int,
        prefixes: tuple[str, ...],
    ) -> None:
        self._seed = seed
        self._number = number
        self._identifier = identifier
        self._sets = sets
        self._year = year
        self._prefixes = prefixes

    def __getitem__(self, prefix: str) -> str:
        if prefix not in self._prefixes:
            raise KeyError(prefix)
        work = _work(self._seed, self._number, self._sets, self._year)
        return _RENDERERS[prefix](work)

    def __contains__(self, prefix: object) -> bool:
        return prefix in self._prefixes

    def __iter__(self) -> Iterator[str]:
        return iter(self._prefixes)

    def __len__(self) -> int:
        return len(self._prefixes)

    def __repr__(self) -> str:
        return f"GeneratedMetadata({self._identifier!r}, {list(self._prefixes)})"


def _sample_sets(count: int) -> dict[str, str]:
    chosen: dict[str, str] = {}
    for spec, name in _SET_POOL[:count]:
        chosen[spec] = name
    for n in range(len(_SET_POOL), count):
        chosen[f"collection-{n + 1}"] = f"Collection {n + 1}"
    # A hierarchical spec needs its parents.
    for spec in list(chosen):
        parts = spec.split(":")
        for i in range(1, len(parts)):
            parent = ":".join(parts[:i])
            chosen.setdefault(parent, dict(_SET_POOL).get(parent, parent.title()))
    return chosen


def _with_parents(spec: str) -> tuple[str, ...]:
    parts = spec.split(":")
    return tuple(":".join(parts[: i + 1]) for i in range(len(parts)))


def _repository_identifier(identifier_prefix: str) -> str:
    parts = identifier_prefix.split(":")
    if len(parts) >= 2 and parts[0] == "oai" and parts[1]:
        return parts[1]
    return "demo.example.org"


def make_dataset(
    n: int,
    *,
    seed: int = 0,
    start: datetime = datetime(2019, 1, 1, tzinfo=UTC),
    end: datetime = datetime(2024, 12, 31, tzinfo=UTC),
    sets: int = 4,
    deleted_ratio: float = 0.05,
    granularity: str = SECONDS,
    prefixes: tuple[str, ...] = ("oai_dc", "datacite"),
    identifier_prefix: str = "oai:demo.example.org:",
    repository_name: str = "Demo Research Repository",
) -> Dataset:
    """A data set of ``n`` realistic records, the same for the same arguments.

    Datestamps spread uniformly over ``[start, end]``; each record sits in one leaf
    set (plus its parents); about ``deleted_ratio`` of them are tombstones.
    """
    unknown = [p for p in prefixes if p not in _RENDERERS]
    if unknown:
        raise ValueError(f"no sample renderer for {unknown}")
    formats = [f for f in DEFAULT_FORMATS if f[0] in prefixes]
    set_names = _sample_sets(sets)
    leaves = [s for s in set_names if not any(o.startswith(s + ":") for o in set_names)]
    memberships = [_with_parents(leaf) for leaf in leaves]
    rng = random.Random(seed)
    lo = int(_as_utc(start).timestamp())
    span = max(int(_as_utc(end).timestamp()) - lo, 1)
    day = granularity == DAY
    fromts = datetime.fromtimestamp
    prefix_tuple = tuple(prefixes)
    records: list[ServedRecord] = []
    rand = rng.random
    randrange = rng.randrange
    for number in range(1, n + 1):
        ts = lo + randrange(span)
        if day:
            ts -= ts % 86400
        stamp = fromts(ts, UTC)
        member = memberships[randrange(len(memberships))] if memberships else ()
        identifier = f"{identifier_prefix}{number}"
        if rand() < deleted_ratio:
            records.append(ServedRecord(identifier, stamp, member, True))
        else:
            year = max(stamp.year - randrange(3), 1990)
            meta = GeneratedMetadata(seed, number, identifier, member, year, prefix_tuple)
            records.append(ServedRecord(identifier, stamp, member, False, meta))
    records.sort(key=_record_key)
    dataset = Dataset(
        repository_name=repository_name,
        granularity=granularity,
        repository_identifier=_repository_identifier(identifier_prefix),
        sets=set_names,
        formats=formats,
    )
    # Records are already normalized and unique: skip the per-record checks of extend().
    dataset._records = records
    dataset._by_id = {r.identifier: r for r in records}
    dataset._changed()
    return dataset
