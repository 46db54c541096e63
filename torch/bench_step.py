"""One benchmark run (under horovodrun): median training-step time and bytes sent per step.

    horovodrun -np 2 -H localhost:2 --gloo python torch/bench_step.py --workload mlp \\
        --compression deepreduce --json out.json
    ... --compression none | fp16          Horovod's own allreduce
    ... --hierarchical                     DeepReduce between hosts only (dense inside)
    ... --compression compute              no communication at all: the floor
    ... --compression powersgd --powersgd-rank 1
                                           PyTorch DDP with the PowerSGD hook (gloo), the peer
                                           a user would pick instead (horovodrun only launches)
"""
import json
import statistics
import time
import zlib

import horovod.torch as hvd
import torch
from torch.nn import functional as F

from options import compression_parser, pipeline_config
from peers import bytes_sent_powersgd, powersgd_model
from deepreduce_hvd.torch import DeepReduce
from digits import MODELS, digits_split
from text import WordLSTM, batches, stdlib_corpus
from train_digits import make_compression

PEERS = ("compute", "powersgd")


def parse_args():
    parser = compression_parser(__doc__)
    parser.set_defaults(compression="deepreduce")
    parser.add_argument("--workload", choices=["cnn", "mlp", "lstm"], required=True)
    parser.add_argument("--peer", choices=PEERS, help="measure a peer instead of Horovod")
    parser.add_argument("--powersgd-rank", type=int, default=1)
    parser.add_argument("--hierarchical", action="store_true",
                        help="DeepReduce(hierarchical=True): dense inside a host, payloads between")
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
    hvd.init(process_sets="dynamic" if args.hierarchical else None)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, loss_fn = workload(args.workload, torch.Generator().manual_seed(hvd.rank()))
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    compression = None
    if args.peer == "powersgd":
        model = powersgd_model(model, args.powersgd_rank)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    elif args.peer is None:
        compression = DeepReduce(**pipeline_config(args), hierarchical=True) \
            if args.hierarchical else make_compression(args)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    times = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup and isinstance(compression, DeepReduce):
            compression.reset_stats()
        hvd.allreduce(torch.zeros(1), name=f"barrier.{step}")  # start every step together
        start = time.perf_counter()
        optimizer.zero_grad()
        loss_fn().backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    if isinstance(compression, DeepReduce):
        bytes_per_step = compression.stats()["bytes_sent"] / args.steps
    elif args.peer == "compute":
        bytes_per_step = 0
    elif args.peer == "powersgd":
        bytes_per_step = bytes_sent_powersgd(model.module, args.powersgd_rank)
    else:
        bytes_per_step = params * (4 if args.compression == "none" else 2)
    checksum = zlib.crc32(torch.cat([p.detach().flatten() for p in model.parameters()]).numpy())
    result = {"median_step_s": statistics.median(times[args.warmup:]),
              "bytes_per_step": bytes_per_step, "dense_bytes_per_step": 4 * params,
              "params_identical": len(set(hvd.allgather_object(checksum))) == 1}
    if isinstance(compression, DeepReduce) and compression.time_aware:
        choices = {}
        for tensor in compression.stats()["tensors"].values():
            choices[tensor["choice"]] = choices.get(tensor["choice"], 0) + 1
        result["choices"] = choices
    results = hvd.allgather_object(result)
    if hvd.rank() == 0:
        merged = {**result, "median_step_s": max(r["median_step_s"] for r in results),
                  "bytes_per_step": sum(r["bytes_per_step"] for r in results) / len(results)}
        with open(args.json, "w") as f:
            json.dump(merged, f)


if __name__ == "__main__":
    main()
