"""AntDT for PyTorch Lightning: ``Trainer(strategy=AntdtStrategy())``.

Installed with ``pip install 'antdt[lightning]'``.

See :mod:`antdt.worker.lightning.strategy` and docs/frameworks.md.
"""

from antdt.worker.frameworks import require

require("lightning", "lightning")

from antdt.worker.lightning.strategy import AntdtStrategy  # noqa: E402

__all__ = ["AntdtStrategy"]
