"""What a plugin transformer's code is, for the records asset's code version: the
version of the distribution that installs its module and a digest of the module's
source file (an edited local plugin changes it). Nothing here imports the plugin."""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os

__all__ = ["distribution_version", "module_identity", "source_digest"]


@functools.cache
def _distributions() -> dict[str, list[str]]:
    """Top-level package -> the distributions that install it (read once per process)."""
    return dict(importlib.metadata.packages_distributions())


def distribution_version(module_name: str) -> str:
    """`name==version` of the distribution that installs `module_name` ("" when none)."""
    top = module_name.partition(".")[0]
    out = []
    for dist in sorted(_distributions().get(top, ())):
        try:
            out.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ",".join(out)


def _origin(module_name: str) -> str | None:
    """The source file of `module_name` without importing it (its parent packages are
    imported, as an import of the module would)."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    return spec.origin


def source_digest(path: str) -> str:
    """A short digest of a file's bytes, cached while its size and mtime hold."""
    try:
        st = os.stat(path)
    except OSError:
        return "unreadable"
    return _digest(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()[:16]
    except OSError:
        return "unreadable"


def module_identity(module_name: str) -> str:
    """The distribution version and source digest of a plugin module."""
    origin = _origin(module_name)
    digest = source_digest(origin) if origin else "no-source"
    return f"{distribution_version(module_name) or 'no-distribution'};{digest}"
