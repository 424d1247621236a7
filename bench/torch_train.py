"""A small PyTorch CPU training loop for profiling by hand (docs/PROFILE-OUTPUT.md,
"Python frames, a real workload"): train() calls step() per batch, step() runs the
model's forward and backward passes and the optimizer (the step of
bench/torch_cnn.py, whose frame is named train_step), so a profile with Python
frames shows train -> train_step -> forward/backward -> libtorch native frames.

    python3 bench/torch_train.py [SECONDS]      (needs `pip install torch==2.13.0`)
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn
from torch_cnn import (
    train_step as step,  # the CNN loop's step (run as a script: bench/ is on the path)
)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def train(seconds: float) -> int:
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
    steps, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        step(model, opt, x, y)
        steps += 1
    return steps


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"{train(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)} steps")
