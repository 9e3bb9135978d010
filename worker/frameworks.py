"""What the framework integrations share: a one-line error when the framework is not installed."""

from __future__ import annotations

import importlib

from antdt.errors import AntdtError


class MissingExtra(AntdtError, ImportError):
    """A framework integration imported without its framework."""


def require(module: str, extra: str) -> None:
    """Raise :class:`MissingExtra` naming the extra to install if ``module`` is not importable."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(f"this antdt integration needs {module}: pip install 'antdt[{extra}]'")
