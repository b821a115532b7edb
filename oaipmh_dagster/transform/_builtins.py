"""The built-in transformers of the format table, loaded by their ``module:function``."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["BUILTIN_FUNCS", "load"]

# The built-ins loaded so far: trusted to return JSON-ready dicts.
BUILTIN_FUNCS: set[Callable[..., dict[str, Any]]] = set()


@functools.cache
def load(ref: str) -> Callable[..., dict[str, Any]]:
    """The function a format row names (``module:function``), imported on first use."""
    module_name, _, attr = ref.partition(":")
    fn: Callable[..., dict[str, Any]] = getattr(importlib.import_module(module_name), attr)
    BUILTIN_FUNCS.add(fn)
    return fn
