"""Data-parallel training of a word-level LSTM language model on the Python standard library's
source with Horovod and DeepReduce; its embedding gradients are sparse by nature, so the
default sparsifier is threshold 0 (every non-zero is sent, nothing else).

    horovodrun -np 2 -H localhost:2 --gloo python torch/train_lm.py --index entropy --value qsgd

Rank 0 prints, per epoch, the training loss, validation perplexity and megabytes sent.
"""
import argparse
import math
import time

import horovod.torch as hvd
import torch
from torch.nn import functional as F

from deepreduce_hvd.history import History
from deepreduce_hvd.torch import DeepReduce
from text import WordLSTM, batches, stdlib_corpus


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compression", choices=["deepreduce", "none", "fp16"], default="deepreduce")
    parser.add_argument("--sparsifier", default="threshold")
    parser.add_argument("--ratio", type=float, default=0.01)
    parser.add_argument("--index", default="entropy")
    parser.add_argument("--value", default="qsgd")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps-per-epoch", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--json", help="rank 0 writes the per-epoch history here")
    return parser.parse_args()


def perplexity(model, data, seq=35, windows=64):
    model.eval()
    with torch.no_grad():
        starts = torch.arange(windows) * ((len(data) - seq - 1) // windows)
        x = torch.stack([data[s:s + seq] for s in starts])
        y = torch.stack([data[s + 1:s + seq + 1] for s in starts])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    model.train()
    return math.exp(loss)


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train, val, vocab = stdlib_corpus()
    model = WordLSTM(vocab)
    if args.compression == "deepreduce":
        compression = DeepReduce(sparsifier=args.sparsifier, ratio=args.ratio, index=args.index,
                                 value=args.value, memory="residual")
    else:
        compression = hvd.Compression.none if args.compression == "none" else hvd.Compression.fp16
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(hvd.rank())
    params = sum(p.numel() for p in model.parameters())
    history = History(hvd.rank(), args.json, vars(args))
    for epoch in range(1, args.epochs + 1):
        start, losses = time.perf_counter(), []
        for _ in range(args.steps_per_epoch):
            x, y = batches(train, 16, 35, generator)
            opt.zero_grad()
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            losses.append(loss.item())
        steps = epoch * args.steps_per_epoch
        if isinstance(compression, DeepReduce):
            sent, dense = compression.stats()["bytes_sent"], compression.stats()["dense_bytes"]
        else:
            dense = 4 * params * steps
            sent = dense if args.compression == "none" else dense // 2
        history.add(epoch, {"loss": sum(losses) / len(losses),
                            "val_perplexity": perplexity(model, val)},
                    sent, dense, time.perf_counter() - start)
    history.save()


if __name__ == "__main__":
    main()
