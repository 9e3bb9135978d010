"""Partial reduce: workers average their models in small groups formed by the grouper (issue 20)."""

from antdt.exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "GroupAverager": "antdt.worker.preduce.averaging",
        "GroupClient": "antdt.worker.preduce.client",
        "NoGroup": "antdt.worker.preduce.client",
    },
)
