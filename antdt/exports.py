"""Public names of a package, imported from their modules on first use.

``antdt.worker`` and its subpackages name their classes at the top (as the
docs show them) without importing torch and Kafka clients for a process
that only needs one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy_exports(package: str, where: dict[str, str]) -> tuple[list[str], Callable[[str], object]]:
    """``(__all__, __getattr__)`` for ``package``: each name in ``where`` from the module named
    beside it."""

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(where[name]), name)

    return sorted(where), __getattr__
