"""Which encoding an OAI-PMH response is in: RFC 7303 and what real servers send."""

from __future__ import annotations

import codecs
import functools
import re

__all__ = ["DECL_ENCODING", "XML_DECL", "apply_http_charset", "codec_name", "http_charset"]

_BOMS = (
    codecs.BOM_UTF8,
    codecs.BOM_UTF32_LE,
    codecs.BOM_UTF32_BE,
    codecs.BOM_UTF16_LE,
    codecs.BOM_UTF16_BE,
)
XML_DECL = re.compile(rb"<\?xml[ \t\r\n][^>]*?\?>")
DECL_ENCODING = re.compile(rb"""[ \t\r\n]encoding[ \t\r\n]*=[ \t\r\n]*["']([A-Za-z][\w.:-]*)["']""")
_CHARSET = re.compile(r"""(?:^|;)\s*charset\s*=\s*["']?([^"';\s]+)""", re.I)


@functools.lru_cache(maxsize=64)
def codec_name(name: str) -> str | None:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def http_charset(content_type: str | None) -> str | None:
    """The codec named by a Content-Type's charset parameter; None if absent or unknown."""
    if not content_type:
        return None
    m = _CHARSET.search(content_type)
    return codec_name(m.group(1)) if m else None


def _contradicts(body: bytes, declared: str | None) -> bool:
    """Whether the bytes cannot be in the encoding the XML declaration names."""
    if declared is None:
        return True
    if declared.startswith(("utf-16", "utf-32")):
        return body.startswith(b"<?xml")  # one byte per character: not UTF-16/32
    try:
        codecs.decode(body, declared)
    except UnicodeDecodeError:
        return True
    return False


def _transcode(body: bytes, charset: str, decl: re.Match[bytes] | None) -> bytes:
    """The body read in `charset`, as UTF-8 without a declaration; as it was when the
    bytes are not in `charset` (the XML rules then apply)."""
    try:
        text = body[decl.end() :].decode(charset) if decl else body.decode(charset)
    except UnicodeDecodeError:
        return body
    return text.encode("utf-8")


def apply_http_charset(body: bytes, content_type: str | None) -> bytes:
    """The body as the parser should see it, following RFC 7303 and real servers.

    A byte order mark wins over everything. The Content-Type's charset decides when the
    document names no encoding, or names one its bytes cannot be in (``utf-16`` over
    one-byte text, ``UTF-8`` over Latin-1 bytes); a declaration its bytes agree with is
    kept (servers often send a default ``ISO-8859-1`` over UTF-8 pages that say so).
    Returns the same object when nothing needs changing (the common case).
    """
    charset = http_charset(content_type)
    if charset is None or body.startswith(_BOMS):
        return body
    decl = XML_DECL.match(body, 0, 1024)
    named = DECL_ENCODING.search(decl.group()) if decl else None
    if named is None:
        return body if charset == "utf-8" else _transcode(body, charset, decl)
    declared = codec_name(named.group(1).decode("ascii"))
    if declared == charset or not _contradicts(body, declared):
        return body
    return _transcode(body, charset, decl)

