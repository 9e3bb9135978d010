"""The training modes of antdt's one training API, and the services each needs beside the three.

One loop shape (``with Job(...) as job: for inputs, labels in job.batches(): ...``),
three ways for the replicas to agree:

* ``sync``: every step's gradient all-reduced, batches sized by AntDT-DD
  (:class:`~antdt.worker.elastic.job.ElasticJob`);
* ``preduce``: partial reduce, replicas averaged in groups of the first
  ready (:class:`~antdt.worker.preduce.job.PartialReduceJob`), formed by
  ``antdt grouper``;
* ``async``: asynchronous training against parameter servers (AntDT-ND,
  :mod:`antdt.worker.ps`).
"""

from __future__ import annotations

from enum import Enum


class TrainingMode(str, Enum):
    SYNC = "sync"
    PREDUCE = "preduce"
    ASYNC = "async"

    @property
    def extra_services(self) -> tuple[str, ...]:
        """The services this mode needs beside the monitor, sharder and controller."""
        return ("grouper",) if self is TrainingMode.PREDUCE else ()
