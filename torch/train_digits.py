"""Data-parallel training of ResNet-20 on scikit-learn's digits with Horovod and DeepReduce.

    horovodrun -np 2 -H localhost:2 --gloo python torch/train_digits.py \\
        --compression deepreduce --index bloom --value qsgd
    ... --compression none | fp16      (Horovod's own, for comparison)
    ... --peer powersgd --powersgd-rank 4    (PyTorch DDP with the PowerSGD hook)
    ... --peer compute                       (no communication: the time floor)

Rank 0 shows a progress bar and prints, per epoch, the training loss, test accuracy and the
megabytes this rank sent against what a dense fp32 allreduce of the same gradients carries,
then a closing line against the dense run recorded in docs/digits_dense_torch.json.
"""
import time
from pathlib import Path

import horovod.torch as hvd
import torch
from torch.nn import functional as F
from tqdm import tqdm

from options import add_digits_training_args, compression_parser, pipeline_config
from peers import add_peer_args, bytes_sent_powersgd, data_parallel
from history import History
from deepreduce_hvd.torch import DeepReduce
from digits import MODELS, digits_split

# the dense run that the closing line compares with (`make demo-baseline` records it)
BASELINE = Path(__file__).resolve().parent.parent / "docs" / "digits_dense_torch.json"


def parse_args():
    parser = compression_parser(__doc__)
    parser.add_argument("--model", default="resnet20", choices=sorted(MODELS))
    return add_digits_training_args(add_peer_args(parser)).parse_args()


def make_compression(args):
    """DeepReduce from the options, or Horovod's own compression (None for a peer)."""
    if getattr(args, "peer", None) is not None:
        return None
    if args.compression == "none":
        return hvd.Compression.none
    if args.compression == "fp16":
        return hvd.Compression.fp16
    return DeepReduce(**pipeline_config(args))


def sent_bytes(args, compression, model, steps):
    """Bytes this rank sent: DeepReduce counts its real payloads; Horovod's dense compressors
    send every gradient at 4 (none) or 2 (fp16) bytes per element; PowerSGD its factors."""
    if isinstance(compression, DeepReduce):
        stats = compression.stats()
        return stats["bytes_sent"], stats["dense_bytes"]
    dense = 4 * steps * sum(p.numel() for p in model.parameters())
    if args.peer == "powersgd":
        return steps * bytes_sent_powersgd(model, args.powersgd_rank), dense
    if args.peer == "compute":
        return 0, dense
    return (dense // 2 if compression is hvd.Compression.fp16 else dense), dense


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return accuracy


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = digits_split(seed=args.seed)
    shard = len(y_train) // hvd.size()  # equal shards: every rank takes the same number of steps
    x_train = x_train[hvd.rank()::hvd.size()][:shard]
    y_train = y_train[hvd.rank()::hvd.size()][:shard]
    model = MODELS[args.model]()
    compression = make_compression(args)
    trained, optimizer = data_parallel(model, args, lambda params: torch.optim.SGD(
        params, lr=args.lr, momentum=0.9, weight_decay=5e-4), compression)
    steps_per_epoch = len(y_train) // args.batch_size
    history, steps = History(hvd.rank(), args.json, {**vars(args), "ranks": hvd.size()}), 0
    decoded = [0.0]  # DeepReduce's decode seconds on this rank after each step
    generator = torch.Generator().manual_seed(args.seed + hvd.rank())
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(y_train), generator=generator)
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch}/{args.epochs}", leave=False,
                   disable=hvd.rank() != 0 or args.no_progress)
        losses, start = [], time.perf_counter()
        for step in bar:
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(trained(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            if isinstance(compression, DeepReduce):
                decoded.append(compression.stats()["decode_s"])
            losses.append(loss.item())
            bar.set_postfix(loss=f"{loss.item():.3f}")
        steps += steps_per_epoch
        loss = hvd.allreduce(torch.tensor(sum(losses) / len(losses)), name=f"loss.{epoch}").item()
        history.add(epoch, {"loss": loss, "test_accuracy": evaluate(model, x_test, y_test)},
                    *sent_bytes(args, compression, model, steps), time.perf_counter() - start)
    history.totals["steps"] = steps
    if isinstance(compression, DeepReduce):  # what this rank (and each rank) received and decoded
        stats = compression.stats()
        history.totals.update(bytes_received=stats["bytes_received"], decode_s=stats["decode_s"],
                              encode_s=stats["encode_s"], guard=stats.get("guard", {}),
                              parameters_identical=parameters_identical(model),
                              **by_rank(stats["bytes_received"], decoded))
    history.compare(args.baseline or BASELINE)
    history.save()


def by_rank(received, decoded):
    """Every rank's bytes received and decode seconds of each step (from the cumulative
    seconds after each step), gathered to every rank."""
    steps = torch.tensor(decoded, dtype=torch.float64).diff()
    mine = torch.cat([torch.tensor([float(received)], dtype=torch.float64), steps])
    gathered = hvd.allgather(mine.unsqueeze(0), name="decode.by_rank")
    return {"bytes_received_by_rank": gathered[:, 0].tolist(),
            "decode_s_by_rank_step": gathered[:, 1:].tolist()}


def parameters_identical(model):
    """Whether every rank holds the same parameters, bit for bit."""
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0), name="parameters.check")
    return bool((gathered == gathered[0]).all())


if __name__ == "__main__":
    main()
