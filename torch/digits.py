"""scikit-learn's digits (8x8 images, on disk) and the models the PyTorch jobs train on it."""
import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F


def digits_split(test_fraction=0.2, seed=0):
    """(x_train, y_train, x_test, y_test) as tensors; images (N, 1, 8, 8) scaled to [0, 1]."""
    data = load_digits()
    x = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.tensor(np.random.default_rng(seed).permutation(len(y)))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet20(nn.Module):
    """ResNet-20 (3 stages of 3 basic blocks, 16/32/64 channels), ~0.27M parameters."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(3):
                layers.append(BasicBlock(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        out = self.layers(F.relu(self.bn(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


class WideMLP(nn.Module):
    """A communication-heavy MLP: 64 -> width -> width -> 10."""

    def __init__(self, width=2048, classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, classes))

    def forward(self, x):
        return self.net(x)


class LeNet(nn.Module):
    """A LeNet-style CNN for 8x8 digits: two 3x3 convolutions, a 2x2 pool, three dense layers."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(6, 16, 3), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(144, 120), nn.ReLU(),
                                        nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class DigitsCNN(nn.Module):
    """The CNN of the time-to-accuracy runs: two 3x3 convolutions (32, 64 channels), a 2x2
    pool, a 256-unit dense layer."""

    def __init__(self, classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Flatten(), nn.Linear(1024, 256), nn.ReLU(),
                                 nn.Linear(256, classes))

    def forward(self, x):
        return self.net(x)


MODELS = {"resnet20": ResNet20, "mlp": WideMLP, "lenet": LeNet, "cnn": DigitsCNN}
