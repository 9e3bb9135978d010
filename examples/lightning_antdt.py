"""A small CNN on synthetic images with PyTorch Lightning under torchrun: Lightning's own DDP
(lightning_plain.py), or with antdt (lightning_antdt.py).

    torchrun --nproc-per-node 3 examples/lightning_plain.py
    antdt up      # in another terminal, then export what it prints, and:
    torchrun --nproc-per-node 3 examples/lightning_antdt.py

``diff examples/lightning_plain.py examples/lightning_antdt.py`` shows what antdt changes. A
group torchrun restarts (``--max-restarts``) resumes from the last checkpoint.
"""

import argparse
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from images import SmallCNN, SyntheticImages, accuracy, one_gpu_per_rank  # noqa: E402

from antdt.worker.lightning import AntdtStrategy  # noqa: E402


class Classifier(pl.LightningModule):
    def __init__(self, dataset: SyntheticImages, batch_size: int):
        super().__init__()
        self.net, self.dataset, self.batch_size = SmallCNN(), dataset, batch_size

    def training_step(self, batch, batch_idx):
        inputs, labels = batch
        return F.cross_entropy(self.net(inputs), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--checkpoints", type=Path, default=Path("checkpoints"))
    parser.add_argument("--save-every", type=int, default=100, help="steps")
    args = parser.parse_args()
    torch.manual_seed(0)
    dataset = SyntheticImages(args.samples)
    model = Classifier(dataset, args.batch_size)
    trainer = pl.Trainer(
        accelerator="gpu" if one_gpu_per_rank() else "cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("WORLD_SIZE", "1"))
        // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy=AntdtStrategy(),
        max_epochs=args.epochs,
        callbacks=[
            ModelCheckpoint(args.checkpoints, save_last=True, every_n_train_steps=args.save_every)
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, ckpt_path="last")
    if trainer.global_rank == 0:
        held_out = accuracy(model.net, dataset.heldout(), model.device)
        print(f"held-out accuracy {held_out:.3f}", flush=True)


if __name__ == "__main__":
    main()
