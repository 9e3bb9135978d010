"""antdt: straggler and leader mitigation for distributed training, on Kafka.

The package is laid out as the design card asks: ``antdt.services`` (monitor,
controller, sharder), ``antdt.worker`` (the agent a training script embeds),
``antdt.schemas`` (contracts and codec), and the shared plumbing here
(settings, topic registry, bus clients, embedded broker, CLI).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("antdt")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
