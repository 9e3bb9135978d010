"""Batch sizing for synchronous training: the step-time model shared by the controller's AntDT-DD
and the in-band sizer."""

from enum import Enum


class BatchSizing(str, Enum):
    """Who sizes a synchronous job's batches.

    ``IN_BAND``: the ranks themselves, from every rank's last steps carried in
    the step's all-reduce (:mod:`antdt.sizing.inband`): no round trip, a new
    split one step after it is known. ``COMMANDS``: the DD controller, from
    the ranks' reports, switched at an agreed step
    (:mod:`antdt.worker.elastic.resize`); its decisions are on the bus.
    """

    IN_BAND = "in-band"
    COMMANDS = "commands"
