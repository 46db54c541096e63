"""How much a top-k selection must send for momentum SGD to follow dense training: the wide
MLP of the time-to-accuracy runs, its ranks simulated in one process with this package's own
Pipeline (selection, residual memory, momentum correction, density warm-up, critical phases,
clipping; payloads encoded and decoded), no Horovod and no network.

    python torch/density_study.py --ratio 0.01 --warmup-steps 22 --local-clip-norm 2.828
    python torch/density_study.py --dense              (the reference: the ranks' plain average)
    python torch/density_study.py --lowrank 4          (every matrix worth it as rank-4 factors)

Each rank's gradient goes through its own Pipeline, every rank decodes the concatenated frames
as an allgather would hand them, and each rank's momentum correction gives the optimizer its
update, as in a Horovod job (tensors under the pipeline's min_size go whole, as the planner
routes them). The dense reference reproduces `torch/train_digits.py --compression none`
epoch for epoch on this machine (same split, init, batch order and optimizer). Per epoch it
prints the test accuracy, the training loss and, for the largest tensor on rank 0, the share
of the compensated velocity's energy the selection sent and the residual's energy against
the energy that step added (how stale the unsent part is).
"""
import argparse
import sys

import numpy as np
import torch
from torch.nn import functional as F

from digits import WideMLP, digits_split
import deepreduce_hvd as dr
from deepreduce_hvd.compression.lowrank import worth_factoring
from deepreduce_hvd.wire.frames import HEADER


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--ratio", type=float, default=0.01)
    parser.add_argument("--value", default="raw", help="value codec (raw: exact values)")
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--fixed-density", action="store_true", help="no critical phases")
    parser.add_argument("--no-momentum-correction", action="store_true",
                        help="error feedback on the gradient, the optimizer's own momentum")
    parser.add_argument("--momentum-masking", action="store_true",
                        help="DGC's momentum factor masking")
    parser.add_argument("--local-clip-norm", type=float, default=None)
    parser.add_argument("--flush-every", type=int, default=0,
                        help="every this many steps after the warm-up, every tensor goes whole "
                             "(the planner's dense route: the residual is sent and cleared)")
    parser.add_argument("--lowrank", type=int, default=0,
                        help="matrices worth it travel as rank-R factors (the low-rank route)")
    parser.add_argument("--dense", action="store_true", help="no compression: the reference")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seeds", default="0,1,2")
    return parser.parse_args()


def pipelines(args):
    momentum = 0.0 if args.no_momentum_correction else 0.9
    return [dr.Pipeline(ratio=args.ratio, index="golomb", value=args.value, memory="residual",
                        warmup_steps=args.warmup_steps, adaptive_density=not args.fixed_density,
                        momentum=momentum, momentum_masking=args.momentum_masking,
                        local_clip_norm=args.local_clip_norm, lowrank=args.lowrank)
            for _ in range(args.ranks)]


def exchange(ranked, name, grads, watch=None, whole=False):
    """The update each rank's optimizer receives for one tensor (the same bits on every rank:
    rank 0's is returned). whole: sent by the dense route, whatever its size. watch: a list
    that gets, for a sparse or factored tensor, rank 0's (share of the compensated tensor's
    energy it sent, its residual's energy against the energy this step added), exact with
    exact values."""
    shape, size = grads[0].shape, grads[0].size
    if whole or size < ranked[0].min_size:  # routed whole (fp32 allreduce)
        total = sum(p.compress_dense(name, g) for p, g in zip(ranked, grads)) / len(ranked)
        delivered = [total.copy() for _ in ranked]
    elif worth_factoring(shape, ranked[0].factors.rank):  # two allreduces: P, then Q
        held = ranked[0].memory.residual(name)
        before = np.zeros(size, np.float32) if held is None else held.ravel().copy()
        p_sum = sum(p.project(name, g) for p, g in zip(ranked, grads))
        compensated = ranked[0].memory.residual(name).ravel().copy()
        q_sum = sum(p.settle(name, p_sum, len(ranked))[0] for p in ranked)
        if watch is not None:
            left = ranked[0].memory.residual(name).ravel()
            watch.append(shares(compensated - left, left, compensated - before))
        delivered = [p.reconstruct(name, q_sum, shape, 1.0 / len(ranked)).reshape(shape)
                     for p in ranked]
    else:
        held = ranked[0].memory.residual(name)
        before = np.zeros(size, np.float32) if held is None else held.ravel().copy()
        frames = [p.compress(name, g) for p, g in zip(ranked, grads)]
        gathered = np.frombuffer(b"".join(frames), np.uint8)
        if watch is not None:
            watch.append(energies(ranked[0], name, frames[0], before))
        delivered = [p.decompress(gathered, shape, "float32", len(ranked), name,
                                  scale=1.0 / len(ranked))[0] for p in ranked]
    if ranked[0].momentum is None:
        return delivered[0]
    return [p.momentum.for_optimizer(name, d) for p, d in zip(ranked, delivered)][0]


def energies(pipeline, name, frame, before):
    """(sent share, residual / step energy) of one rank's compress of tensor `name`."""
    values, indices, _ = dr.decode(np.frombuffer(frame, np.uint8)[HEADER:])
    left = pipeline.memory.residual(name).ravel()
    compensated = left.copy()
    compensated[indices] += values
    return shares(values, left, compensated - before)


def shares(sent, kept, added):
    """(sent energy / compensated energy, kept energy / the energy this step added): sent and
    kept are orthogonal parts of the compensated tensor (disjoint positions for top-k, a
    projection and its complement for low-rank factors)."""
    sent, kept = float(np.dot(sent, sent)), float(np.dot(kept, kept))
    return sent / (sent + kept or 1.0), kept / (float(np.dot(added, added)) or 1e-30)


def train(args, seed):
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = digits_split(seed=seed)
    shard = len(y_train) // args.ranks
    xs = [x_train[r::args.ranks][:shard] for r in range(args.ranks)]
    ys = [y_train[r::args.ranks][:shard] for r in range(args.ranks)]
    model = WideMLP()
    named = list(model.named_parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    generators = [torch.Generator().manual_seed(seed + r) for r in range(args.ranks)]
    ranked = None if args.dense else pipelines(args)
    largest = max(named, key=lambda item: item[1].numel())[0]
    steps = shard // args.batch_size
    for epoch in range(1, args.epochs + 1):
        orders = [torch.randperm(shard, generator=g) for g in generators]
        losses, watch = [], []
        for step in range(steps):
            grads = []
            for r in range(args.ranks):
                batch = orders[r][step * args.batch_size:(step + 1) * args.batch_size]
                model.zero_grad()
                loss = F.cross_entropy(model(xs[r][batch]), ys[r][batch])
                loss.backward()
                losses.append(loss.item())
                grads.append({n: p.grad.numpy().copy() for n, p in named})
            done = (epoch - 1) * steps + step - args.warmup_steps  # steps since the warm-up
            whole = args.flush_every > 0 and done >= 0 and \
                done % args.flush_every == args.flush_every - 1
            for name, param in named:
                tensors = [g[name] for g in grads]
                if ranked is None:
                    param.grad = torch.from_numpy(sum(tensors) / args.ranks)
                    continue
                watched = watch if name == largest and not whole else None
                update = exchange(ranked, name, tensors, watched, whole)
                param.grad = torch.from_numpy(np.ascontiguousarray(update, np.float32))
            optimizer.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        shares, staleness = np.mean(watch, axis=0) if watch else (0.0, 0.0)
        extra = "" if ranked is None else \
            f"  sent share {shares:.2f}  residual / step energy {staleness:6.1f}"
        print(f"seed {seed} epoch {epoch}  loss {np.mean(losses):.3f}  test accuracy "
              f"{100 * accuracy:5.1f}{extra}", flush=True)


def main():
    args = parse_args()
    for seed in (int(s) for s in args.seeds.split(",")):
        train(args, seed)


if __name__ == "__main__":
    sys.exit(main())
