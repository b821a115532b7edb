"""What a transformer's code is, for the records asset's code version: for a plugin the
version of the distribution that installs its module and a digest of the module's
source file (an edited local plugin changes it; nothing here imports the plugin); for a
built-in a digest of its module's source and of the package modules it uses
(:func:`package_identity`), so an edited built-in changes it."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os

__all__ = ["distribution_version", "module_identity", "package_identity", "source_digest"]


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


def _imports(name: str, path: str) -> frozenset[str]:
    """The modules a source file imports (relative imports resolved against `name`),
    read again when the file's size or mtime changes."""
    try:
        st = os.stat(path)
    except OSError:
        return frozenset()
    return _parsed_imports(name, path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _parsed_imports(name: str, path: str, size: int, mtime_ns: int) -> frozenset[str]:
    try:
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    package = name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(out)


def _used_modules(module_name: str, package: str) -> list[tuple[str, str]]:
    """(name, source file) of `module_name` and of the modules of `package` it imports,
    transitively, sorted by name."""
    seen: dict[str, str] = {}
    todo = [module_name]
    while todo:
        name = todo.pop()
        if name in seen or name == package:
            continue
        origin = _origin(name)
        if origin is None:
            continue
        seen[name] = origin
        todo += [m for m in _imports(name, origin)
                 if m.startswith(package + ".") and m not in seen]
    return sorted(seen.items())


def package_identity(module_name: str, package: str) -> str:
    """A digest of the sources of a module of `package` and of the modules of `package`
    it imports, transitively (the built-in transformers: an edit of one, or of a helper
    it imports, changes it)."""
    digest = hashlib.sha256()
    for name, origin in _used_modules(module_name, package):
        digest.update(f"{name}={source_digest(origin)};".encode())
    return digest.hexdigest()[:16]
