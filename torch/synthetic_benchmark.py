"""Horovod's synthetic benchmark, in the shape of its examples/pytorch/pytorch_synthetic_benchmark.py:
ResNet-50 (torchvision's architecture, 25.6M parameters, written out here since torchvision
is not a dependency) on random 224x224 images, images per second per rank.

    horovodrun -np 2 -H localhost:2 --gloo python torch/synthetic_benchmark.py \\
        --compression deepreduce          (the default DeepReduce(); none / fp16: Horovod's own)
    ... --peer powersgd --powersgd-rank 4 (PyTorch DDP with the PowerSGD hook)
    ... --peer compute                    (no communication: the time floor)

The first --warmup steps are not timed; they cover the time-aware planner's calibration and
exploration. Rank 0 prints img/s (mean and spread over --iters timed iterations).
"""
import time

import horovod.torch as hvd
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from history import save_synthetic
from options import add_synthetic_args, compression_parser
from peers import add_peer_args, data_parallel
from train_digits import make_compression


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = 4 * width
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential()
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.downsample(x))


class ResNet50(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = 4 * width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def main():
    parser = add_synthetic_args(add_peer_args(compression_parser(__doc__)))
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = ResNet50()
    compression = make_compression(args)
    trained, optimizer = data_parallel(model, args, lambda params: torch.optim.SGD(
        params, lr=0.01 * hvd.size()), compression)
    data = torch.randn(args.batch_size, 3, 224, 224)
    target = torch.randint(0, 1000, (args.batch_size,))

    def step():
        optimizer.zero_grad()
        F.cross_entropy(trained(data), target).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.iters):
        start = time.perf_counter()
        for _ in range(args.batches_per_iter):
            step()
        rates.append(args.batch_size * args.batches_per_iter / (time.perf_counter() - start))
    rates = hvd.allgather_object(float(np.mean(rates)))
    if hvd.rank() == 0:
        save_synthetic(args.peer or args.compression, rates, sum(p.numel() for p in model.parameters()), compression, args.json)

if __name__ == "__main__":
    main()
