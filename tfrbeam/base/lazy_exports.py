"""A package's exported names, each imported from its module on first use (PEP 562).

``import tfrbeam`` and ``import tfrbeam.beam`` stay cheap this way: the format core never pulls in
Beam, and a build does not load the readers, statistics or Parquet export it does not run.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str], listed: list[str]) -> tuple[
        Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps a name to its module.

    A name, once imported, is set on the package, so later lookups do not come here.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return listed

    return __getattr__, __dir__
