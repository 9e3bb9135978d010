"""The parameter server: asynchronous training (AntDT-ND's setting) against one shared model.

One or more server processes (:mod:`server`, ``antdt ps``) hold the model's
parameters, split between them (:mod:`layout`); workers (:mod:`client`)
pull parameters and push gradients at their own pace (a script under
torchrun: :class:`~antdt.worker.ps.job.ParameterServerJob`). An update is applied
exactly when the shard log records its commit, so the model and the log
cannot disagree (docs/parameter-server.md).
"""

from __future__ import annotations

from antdt.exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "Layout": "antdt.worker.ps.layout",
        "ParameterClient": "antdt.worker.ps.client",
        "ParameterServerJob": "antdt.worker.ps.job",
        "ParameterServer": "antdt.worker.ps.server",
        "ServerSpec": "antdt.worker.ps.server",
    },
)
