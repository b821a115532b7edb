"""The XML of responses, written as text: the envelope, headers, records, errors.

Record metadata goes out as stored (the `<metadata>` child a harvest serialized), so a
page costs string joins, not a tree."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from xml.sax.saxutils import escape, quoteattr

OAI_NS = "http://www.openarchives.org/OAI/2.0/"
SCHEMA_LOCATION = f"{OAI_NS} http://www.openarchives.org/OAI/2.0/OAI-PMH.xsd"
_OPEN = ('<?xml version="1.0" encoding="UTF-8"?>\n'
         f'<OAI-PMH xmlns="{OAI_NS}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
         f'xsi:schemaLocation="{SCHEMA_LOCATION}">')
# Characters XML 1.0 forbids (an argument is echoed; a stored value is already XML).
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>\s*")
# A root start tag without a prefix and without its own default namespace declaration.
_UNQUALIFIED_ROOT = re.compile(r"^<([A-Za-z_][\w.\-]*)(?=[\s/>])(?![^>]*\sxmlns\s*=)")


def clean(text: str) -> str:
    """`text` without the characters XML cannot hold."""
    return _NOT_XML.sub("\ufffd", text)


def text(value: str) -> str:
    return escape(clean(value))


def attr(value: str) -> str:
    return quoteattr(clean(value), {"\n": "&#10;", "\r": "&#13;", "\t": "&#9;"})


def datestamp(value: datetime) -> str:
    """`YYYY-MM-DDThh:mm:ssZ` in UTC (the provider's granularity is seconds)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def open_response(response_date: datetime, base_url: str,
                  args: Mapping[str, str] | None) -> str:
    """The envelope up to the verb's element; `args` None: a request echoed without
    attributes (badVerb, badArgument)."""
    attrs = "".join(f" {k}={attr(v)}" for k, v in (args or {}).items())
    return (f"{_OPEN}<responseDate>{datestamp(response_date)}</responseDate>"
            f"<request{attrs}>{text(base_url)}</request>")


CLOSE = "</OAI-PMH>\n"


def error(code: str, message: str) -> str:
    return f'<error code="{code}">{text(message)}</error>'


def header(identifier: str, stamp: str, set_specs: Iterable[str], deleted: bool) -> str:
    sets = "".join(f"<setSpec>{text(s)}</setSpec>" for s in set_specs)
    status = ' status="deleted"' if deleted else ""
    return (f"<header{status}><identifier>{text(identifier)}</identifier>"
            f"<datestamp>{stamp}</datestamp>{sets}</header>")


def metadata(raw_xml: str | None) -> str:
    """The `<metadata>` element around stored XML (nothing when none is stored)."""
    if not raw_xml:
        return ""
    if raw_xml.startswith("<?") or raw_xml[:1].isspace():
        raw_xml = _DECLARATION.sub("", raw_xml, count=1)
    # Unqualified names stay in no namespace, not in the envelope's default one.
    raw_xml = _UNQUALIFIED_ROOT.sub(r'<\1 xmlns=""', raw_xml, count=1)
    return f"<metadata>{raw_xml}</metadata>"


def token(value: str, cursor: int, total: int) -> str:
    """A resumptionToken element; `value` "" ends the list."""
    return (f'<resumptionToken completeListSize="{max(total, 1)}" cursor="{cursor}">'
            f"{text(value)}</resumptionToken>")
