"""Partial reduce: workers average their models in small groups formed by the grouper.

``PartialReduceJob`` is the training API (the loop of :class:`~antdt.worker.ElasticJob`);
``GroupClient`` and ``GroupAverager`` are its parts, for a loop of one's own.
"""

from antdt.exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "GroupAverager": "antdt.worker.preduce.averaging",
        "GroupClient": "antdt.worker.preduce.client",
        "NoGroup": "antdt.worker.preduce.client",
        "PartialReduceJob": "antdt.worker.preduce.job",
    },
)
