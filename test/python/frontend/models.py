"""Small reference models built from configs with random weights (nothing downloaded)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_tpu.examples.quickstart import TinyGPT


def mlp(width: int = 32, depth: int = 3, classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(16 if i == 0 else width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.conv2(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def tiny_gpt() -> nn.Module:
    return TinyGPT(vocab=64, d=32, heads=4, layers=2, seq=16)
