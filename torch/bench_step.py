"""One benchmark run (under horovodrun): median training-step time and bytes sent per step.

    horovodrun -np 2 -H localhost:2 --gloo python torch/bench_step.py --workload mlp \\
        --compression deepreduce --index entropy --value qsgd --json out.json
"""
import json
import statistics
import time

import horovod.torch as hvd
import torch
from torch.nn import functional as F

from deepreduce_hvd.cli import compression_parser
from deepreduce_hvd.torch import DeepReduce
from digits import MODELS, digits_split
from text import WordLSTM, batches, stdlib_corpus
from train_digits import make_compression


def parse_args():
    parser = compression_parser(__doc__, value="qsgd")
    parser.add_argument("--workload", choices=["cnn", "mlp", "lstm"], required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", required=True)
    return parser.parse_args()


def workload(name, generator):
    """(model, loss-of-a-fresh-batch function)."""
    if name == "lstm":
        train, _, vocab = stdlib_corpus()
        model = WordLSTM(vocab)

        def loss():
            x, y = batches(train, 16, 35, generator)
            return F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        return model, loss
    x, y, _, _ = digits_split()
    model = MODELS["resnet20" if name == "cnn" else "mlp"]()

    def loss():
        pick = torch.randint(0, len(y), (32,), generator=generator)
        return F.cross_entropy(model(x[pick]), y[pick])
    return model, loss


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, loss_fn = workload(args.workload, torch.Generator().manual_seed(hvd.rank()))
    compression = make_compression(args)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    times = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup and isinstance(compression, DeepReduce):
            compression.reset_stats()
        hvd.allreduce(torch.zeros(1), name=f"barrier.{step}")  # start every step together
        start = time.perf_counter()
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
        times.append(time.perf_counter() - start)
    params = sum(p.numel() for p in model.parameters())
    if isinstance(compression, DeepReduce):
        bytes_per_step = compression.stats()["bytes_sent"] / args.steps
    else:
        bytes_per_step = params * (4 if args.compression == "none" else 2)
    result = {"median_step_s": statistics.median(times[args.warmup:]),
              "bytes_per_step": bytes_per_step, "dense_bytes_per_step": 4 * params}
    results = hvd.allgather_object(result)
    if hvd.rank() == 0:
        merged = {"median_step_s": max(r["median_step_s"] for r in results),
                  "bytes_per_step": sum(r["bytes_per_step"] for r in results) / len(results),
                  "dense_bytes_per_step": result["dense_bytes_per_step"]}
        with open(args.json, "w") as f:
            json.dump(merged, f)


if __name__ == "__main__":
    main()
