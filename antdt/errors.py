"""One exception root for everything antdt raises on purpose.

Callers (the CLI above all) catch :class:`AntdtError` and print its message as
one line; anything else is a bug and keeps its traceback.
"""


class AntdtError(Exception):
    """Root of every error antdt raises deliberately. The message is one line; ``exit_code`` is
    the process's when the CLI ends on it (a supervisor may act on it)."""

    exit_code = 1


class ShardStateLost(AntdtError):
    """The sharder refused to rewind a job to a checkpoint's version: the shard state that
    checkpoint belongs to is gone (its log and snapshots lost together with the sharder's memory: a
    double fault, docs/reliability.md), or never was this job's. A restart would only ask again:
    the job must be started again, and the process ends with exit code 78 to say so."""

    exit_code = 78


class ConfigError(AntdtError):
    """A setting is missing or has a bad value; the message names the variable."""


class BrokerError(AntdtError):
    """The embedded broker could not be found, started or reached."""


class BusError(AntdtError):
    """A Kafka client operation failed (topic creation, delivery, metadata)."""


class TopicMissing(BusError):
    """A topic antdt needs does not exist (yet: the bus may be in the middle of a reset)."""


class BusUnreachable(BusError):
    """The bus gave no cluster metadata within the wait: nothing answers at its address."""


class AuthenticationError(BusError):
    """The broker refused the client's credentials (or its SASL mechanism); retrying cannot help."""


class SchemaError(AntdtError):
    """An Avro schema is missing, malformed, or disagrees with its model."""


class CodecError(AntdtError):
    """Bytes could not be decoded into a message, or a message could not be encoded."""


class UnknownSchemaError(CodecError):
    """The writer schema named by a message's fingerprint or id is not known here."""
