"""Data-parallel training of a word-level LSTM language model on the Python standard library's
source with Horovod and DeepReduce; its embedding gradients are sparse by nature, so the
default sparsifier is threshold 0 (every non-zero is sent, nothing else; by default the planner
chooses exact or fp16 values per tensor, or Horovod's fp16 allreduce for the dense ones).

    horovodrun -np 2 -H localhost:2 --gloo python torch/train_lm.py --index entropy --value qsgd

Rank 0 prints, per epoch, the training loss, validation perplexity and megabytes sent.
"""
import math
import time

import horovod.torch as hvd
import torch
from torch.nn import functional as F

from options import compression_parser
from peers import add_peer_args, data_parallel
from history import History
from text import WordLSTM, batches, stdlib_corpus
from train_digits import make_compression, sent_bytes


def parse_args():
    parser = compression_parser(__doc__, sparsifier="threshold")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps-per-epoch", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="rank 0 writes the per-epoch history here")
    return add_peer_args(parser).parse_args()


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
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train, val, vocab = stdlib_corpus()
    model = WordLSTM(vocab)
    compression = make_compression(args)
    trained, opt = data_parallel(model, args, lambda params: torch.optim.SGD(params, lr=args.lr),
                                 compression)
    generator = torch.Generator().manual_seed(args.seed + hvd.rank())
    history = History(hvd.rank(), args.json, vars(args))
    for epoch in range(1, args.epochs + 1):
        start, losses = time.perf_counter(), []
        for _ in range(args.steps_per_epoch):
            x, y = batches(train, 16, 35, generator)
            opt.zero_grad()
            loss = F.cross_entropy(trained(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            losses.append(loss.item())
        history.add(epoch, {"loss": sum(losses) / len(losses),
                            "val_perplexity": perplexity(model, val)},
                    *sent_bytes(args, compression, model, epoch * args.steps_per_epoch),
                    time.perf_counter() - start)
    history.save()


if __name__ == "__main__":
    main()
