"""The parameter server: asynchronous training (AntDT-ND's setting) against one shared model.

One or more server processes (:mod:`server`, ``antdt ps``) hold the model's
parameters, split between them (:mod:`layout`); workers (:mod:`client`)
pull parameters and push gradients at their own pace. An update is applied
exactly when the shard log records its commit, so the model and the log
cannot disagree (docs/parameter-server.md).
"""

from __future__ import annotations

import importlib

__all__ = ["Layout", "ParameterClient", "ParameterServer", "ServerSpec"]
_WHERE = {
    "Layout": "layout",
    "ParameterClient": "client",
    "ParameterServer": "server",
    "ServerSpec": "server",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"antdt.worker.ps.{_WHERE[name]}"), name)
    raise AttributeError(name)
