"""The process that runs ``xslt:`` stylesheets, and what it shares with the parent.

libxslt cannot be interrupted, so records are transformed in a child process that the
parent (:mod:`._sandbox`) kills when a record runs over its time budget. This module
needs nothing but the standard library and lxml: the child runs it by file path,
without importing the package.

Protocol, over the child's stdin and stdout: frames of one kind byte, a 4-byte
big-endian length and the payload. The parent sends ``S`` (a stylesheet: a JSON
header, a newline, the stylesheet's bytes) and ``R`` (one record's XML). The child
answers ``S`` with ``L`` (ready) or ``E``, and each ``R``, in order, with ``O`` (the
result's root element in UTF-8), ``E`` (a JSON ``{"type", "message"}``) or ``X`` (an ``E``
after which the child exits: it ran out of memory).

Confinement (in the child, and for the parent's own compile): the stylesheet and
every file it includes or reads with ``document()`` are parsed without DTDs, entities
or network; ``document()`` and includes read only files under the stylesheet's own
directory or the local files the parent found it includes; libxslt's access control
refuses the network and every write.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from collections.abc import Iterable
from typing import Any, cast
from urllib.parse import unquote, urlsplit

from lxml import etree

HEADER = struct.Struct("!cI")
MESSAGE_CHARS = 1000  # of an error message sent back
_CACHED = 8  # compiled stylesheets kept by one worker
# cast: lxml-stubs declare none of these keywords.
ACCESS = cast(Any, etree.XSLTAccessControl)(
    read_file=True, write_file=False, create_dir=False, read_network=False,
    write_network=False,
)


class Refused(Exception):
    """A stylesheet asked for a file outside its directory, or for a URL."""


def parser() -> etree.XMLParser:
    """The parser of stylesheets, their includes and ``document()`` files."""
    return etree.XMLParser(no_network=True, resolve_entities=False, load_dtd=False,
                           huge_tree=False)


def record_parser() -> etree.XMLParser:
    """The parser of the records the parent sends (already parsed once by it)."""
    return etree.XMLParser(no_network=True, resolve_entities=False, load_dtd=False,
                           huge_tree=True, remove_blank_text=False)


def _local_path(url: str) -> str | None:
    """The file a URL names, or None when it is not a local file."""
    parts = urlsplit(url)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return unquote(parts.path)
    if not parts.scheme:
        return url
    return None


class Confined(etree.Resolver):
    """Loads files under `root` and the given files; refuses anything else."""

    def __init__(self, stylesheet: str, files: Iterable[str]) -> None:
        super().__init__()
        self.root = os.path.join(os.path.realpath(os.path.dirname(stylesheet)), "")
        self.files = {os.path.realpath(f) for f in files}

    def resolve(self, url: str, pubid: str | None, context: Any) -> Any:  # type: ignore[override]
        path = _local_path(url)
        if path is None:
            raise Refused(f"reading {url!r} refused: stylesheets read local files only")
        real = os.path.realpath(path)
        if real in self.files or real.startswith(self.root):
            return cast(Any, self).resolve_filename(real, context)
        raise Refused(f"reading {path} refused: document() reads only files under the "
                      f"stylesheet's directory {self.root.rstrip(os.sep) or os.sep}")


def compile_stylesheet(source: bytes, path: str, files: Iterable[str]) -> etree.XSLT:
    """The stylesheet compiled with the confinement above (lxml's errors propagate)."""
    p = parser()
    p.resolvers.add(Confined(path, files))
    return etree.XSLT(etree.fromstring(source, p, base_url=path), access_control=ACCESS)


def log_text(log: Any, fallback: str) -> str:
    """libxslt's error log, shortened: distinct messages, the first one's line."""
    messages: list[str] = []
    line = 0
    for entry in log:
        message = (entry.message or "").strip()
        if not line and entry.line:
            line = entry.line
        if message and message not in messages:
            messages.append(message)
    text = "; ".join(messages[:3]) or fallback
    return f"{text} (stylesheet line {line})" if line else text


class Failed(Exception):
    """A record the stylesheet could not transform (its message is the record's)."""


def apply(xslt: etree.XSLT, record: bytes, params: dict[str, Any], max_output: int,
          record_parser: etree.XMLParser) -> bytes:
    """One record through the stylesheet: its result's root element, serialized in
    UTF-8; :class:`Failed`."""
    doc = etree.fromstring(record, record_parser)
    try:
        result = xslt(doc, **params)
    except etree.XSLTApplyError as exc:
        raise Failed(f"XSLT failed: {log_text(cast(Any, xslt).error_log, str(exc))}") from None
    except Refused as exc:
        raise Failed(f"XSLT failed: {exc}") from None
    root = result.getroot()
    if root is None:
        what = "an empty result" if not str(result).strip() else "text, not XML"
        raise Failed(f"XSLT produced {what}: no root element")
    out = etree.tostring(root, encoding="UTF-8", xml_declaration=False)
    if len(out) > max_output:
        raise Failed(f"XSLT output of {len(out):,} bytes exceeds the output budget of "
                     f"{max_output:,} bytes (xslt.max-output)")
    return out


# -- the child ---------------------------------------------------------------------------


class _Output:
    """Answers on their way to the parent: written in one go when the input runs dry,
    or by a thread once the oldest has waited `DELAY` (a record that never ends leaves
    every earlier answer sent, so the parent blames the right one)."""

    DELAY = 0.01

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending: list[bytes] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._flusher, daemon=True).start()

    def add(self, kind: bytes, payload: bytes) -> None:
        with self.cond:
            self.pending.append(HEADER.pack(kind, len(payload)) + payload)
            if len(self.pending) == 1:
                self.cond.notify()

    def flush(self) -> None:
        with self.cond:
            data, self.pending = b"".join(self.pending), []
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]

    def _flusher(self) -> None:
        while True:
            with self.cond:
                while not self.pending:
                    self.cond.wait()
            time.sleep(self.DELAY)
            self.flush()


class _Input:
    """Frames from the parent, read in large chunks."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.at = 0  # where the next frame starts in buf

    def buffered(self) -> tuple[bytes, bytes] | None:
        """The next frame already read, if any."""
        if len(self.buf) - self.at < HEADER.size:
            return None
        kind, size = HEADER.unpack_from(self.buf, self.at)
        end = self.at + HEADER.size + size
        if len(self.buf) < end:
            return None
        payload = bytes(self.buf[self.at + HEADER.size:end])
        self.at = end
        return kind, payload

    def fill(self) -> bool:
        """Wait for more input; False at its end."""
        del self.buf[:self.at]
        self.at = 0
        data = os.read(self.fd, 1 << 20)
        self.buf += data
        return bool(data)


def _error(kind: str, message: str) -> bytes:
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + "..."
    return json.dumps({"type": kind, "message": message}).encode()


def _orphan_watch() -> None:
    """Exit when the parent is gone (a stylesheet that never ends sees no EOF)."""
    parent = os.getppid()
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(3)


class _Child:
    """The child's state: its compiled stylesheets and the one in use."""

    def __init__(self) -> None:
        self.parser = record_parser()
        self.memory = 0  # the address space allowed, bytes
        self.compiled: dict[str, tuple[etree.XSLT, dict[str, Any], int]] = {}
        self.current: tuple[etree.XSLT, dict[str, Any], int] | None = None

    def select(self, payload: bytes) -> tuple[bytes, bytes]:
        head, _, source = payload.partition(b"\n")
        spec = json.loads(head)
        self.memory = int(spec["max_memory"])
        _set_memory(self.memory)
        key = spec["key"]
        if key not in self.compiled:
            try:
                xslt = compile_stylesheet(source, spec["path"], spec["files"])
            except Exception as exc:  # noqa: BLE001 - told to the parent
                self.current = None
                return b"E", _error("bad_stylesheet", f"stylesheet does not compile: {exc}")
            params = {k: etree.XSLT.strparam(v) for k, v in spec["params"].items()}
            if len(self.compiled) >= _CACHED:
                self.compiled.clear()
            self.compiled[key] = (xslt, params, int(spec["max_output"]))
        self.current = self.compiled[key]
        return b"L", b""

    def record(self, payload: bytes) -> tuple[bytes, bytes]:
        if self.current is None:
            return b"E", _error("bad_stylesheet", "no usable stylesheet")
        xslt, params, max_output = self.current
        try:
            return b"O", apply(xslt, payload, params, max_output, self.parser)
        except Failed as exc:
            return self._failure(str(exc))
        except MemoryError:
            return self._failure("MemoryError", memory=True)
        except Exception as exc:  # noqa: BLE001 - one record's failure
            return self._failure(f"{type(exc).__name__}: {exc}")

    def _failure(self, message: str, memory: bool = False) -> tuple[bytes, bytes]:
        """A failed record's answer: ``X`` (then exit) when it ran out of memory (libxslt
        tells a failed allocation only as a runtime error)."""
        if memory or peak_memory() >= 0.8 * self.memory:
            return b"X", _error("transform_failed", "XSLT ran over the memory ceiling of "
                                f"{self.memory / 2**20:g} MiB (xslt.max-memory): {message}")
        return b"E", _error("transform_failed", message)


def peak_memory(pid: int | str = "self") -> int:
    """The most address space process `pid` has had, in bytes (0 where unknown)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmPeak:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _set_memory(limit: int) -> None:
    """Cap this process's address space (the soft limit, below any hard one)."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main() -> None:
    """Serve the parent until its end of the pipe closes."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C reaches both
    out = _Output(os.dup(1))
    os.dup2(2, 1)  # nothing else may write into the protocol
    threading.Thread(target=_orphan_watch, daemon=True).start()
    serve(_Input(0), out, _Child())


def serve(inp: _Input, out: _Output, child: _Child) -> None:
    """Answer frames until the input ends (or memory runs out: then exit)."""
    handlers = {b"S": child.select, b"R": child.record}
    while True:
        frame = inp.buffered()
        if frame is None:
            out.flush()
            if not inp.fill():
                return
            continue
        answer, body = handlers[frame[0]](frame[1])
        out.add(answer, body)
        if answer == b"X":
            out.flush()
            os._exit(4)


if __name__ == "__main__":
    main()
