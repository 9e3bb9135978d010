"""What both examples train: a small CNN on synthetic images (nothing to download).

Ten classes, each a fixed random 16x16 pattern; a sample is its class's
pattern under noise, drawn from a seed, so every rank builds the same
dataset and a held-out set from the same classes shows what was learnt.
"""

import os

import torch
from torch import nn

SIDE = 16
CLASSES = 10


class SyntheticImages(torch.utils.data.Dataset):
    """``size`` (image, label) pairs: one channel, ``SIDE`` x ``SIDE``, ``CLASSES`` classes."""

    def __init__(self, size: int, seed: int = 0, draw: int = 1, noise: float = 1.5):
        patterns = torch.randn(
            CLASSES, 1, SIDE, SIDE, generator=torch.Generator().manual_seed(seed)
        )
        generator = torch.Generator().manual_seed(seed * 7919 + draw)
        self.labels = torch.randint(0, CLASSES, (size,), generator=generator)
        self.images = patterns[self.labels] + noise * torch.randn(
            size, 1, SIDE, SIDE, generator=generator
        )
        self.seed, self.noise = seed, noise

    def heldout(self, size: int = 2000) -> "SyntheticImages":
        return SyntheticImages(size, self.seed, draw=2, noise=self.noise)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classify = nn.Linear(32 * (SIDE // 4) ** 2, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(images).flatten(1))


@torch.no_grad()
def accuracy(model: nn.Module, data: SyntheticImages, device: torch.device) -> float:
    model.eval()
    predicted = model(data.images.to(device)).argmax(1).cpu()
    model.train()
    return (predicted == data.labels).float().mean().item()


def one_gpu_per_rank() -> bool:
    """Whether every local rank has a GPU of its own: NCCL refuses two ranks on one device.

    With fewer GPUs than ranks (a laptop, a CPU-only CI) the examples train on
    the CPU over gloo instead of failing at start-up.
    """
    return torch.cuda.is_available() and torch.cuda.device_count() >= int(
        os.environ.get("LOCAL_WORLD_SIZE", "1")
    )
