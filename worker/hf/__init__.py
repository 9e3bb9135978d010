"""AntDT for Hugging Face transformers: ``AntdtTrainer`` in place of ``Trainer``.

Installed with ``pip install 'antdt[hf]'``.

See :mod:`antdt.worker.hf.trainer` and docs/frameworks.md.
"""

from antdt.worker.frameworks import require

require("transformers", "hf")
require("accelerate", "hf")

from antdt.worker.hf.trainer import AntdtTrainer  # noqa: E402

__all__ = ["AntdtTrainer"]
