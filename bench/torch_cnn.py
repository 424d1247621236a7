"""A small CNN trained on the CPU from a DataLoader with 2 worker processes: the
PyTorch loop of issue 33, profiled by tests/kernel/test_torch_profile.py and
bench/torch_chains.py. train() calls train_step() per batch; the workers run
RandomImages.__getitem__; train_step runs SmallCNN.forward, backward and SGD.

    python3 bench/torch_cnn.py [SECONDS]        (needs `pip install torch==2.13.0`)

Prints the number of steps taken on stderr (stdout is the profiler's, when it
runs the loop as `gfxclient --json profile -- ...`). One intra-op thread, so that every sample
of the step is on the main thread and the step's share is the main thread's.
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RandomImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """32x32 RGB images made up per index (deterministic), 10 classes."""

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 32, 32, generator=g), torch.tensor(i % 10)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def train_step(
    model: SmallCNN, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> float:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def train(seconds: float) -> int:
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(RandomImages(), batch_size=64, num_workers=2)
    steps, deadline = 0, time.monotonic() + seconds
    for x, y in loader:
        train_step(model, opt, x, y)
        steps += 1
        if time.monotonic() >= deadline:
            break
    return steps


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"{train(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)} steps", file=sys.stderr)
