"""The peers our jobs compare with besides Horovod (PyTorch DDP with the PowerSGD hook, and
no communication at all), and the one place a job picks how it trains data-parallel."""
import os

import horovod.torch as hvd
import torch
import torch.distributed as dist


def powersgd_model(model, rank):
    """DDP over gloo (addresses from horovodrun's environment) with the PowerSGD hook, every
    gradient in one bucket (with several, gloo mismatched the hook's collectives: the default
    buckets on the digits models, 25 MB ones on ResNet-50)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
    megabytes = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=max(25, 1.1 * megabytes))
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                   start_powerSGD_iter=2, min_compression_rate=2, use_error_feedback=True,
                                   warm_start=True)
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    return ddp


def bytes_sent_powersgd(model, rank):
    """What PowerSGD sends per step: P (n x r) and Q (m x r) for each compressed matrix, the
    rest dense (what its hook does with min_compression_rate=2)."""
    total = 0
    for p in model.parameters():
        if p.dim() >= 2:
            n, m = p.shape[0], p[0].numel()
            low_rank = (n + m) * rank
            total += 4 * (low_rank if low_rank * 2 <= n * m else n * m)
        else:
            total += 4 * p.numel()
    return total


def add_peer_args(parser):
    parser.add_argument("--peer", choices=["compute", "powersgd"],
                        help="instead of Horovod: no communication (the time floor), or DDP "
                             "with the PowerSGD hook")
    parser.add_argument("--powersgd-rank", type=int, default=1)
    return parser


def data_parallel(model, args, make_optimizer, compression):
    """(the module to train, its optimizer): Horovod's DistributedOptimizer with `compression`
    (DeepReduce learns the optimizer's momentum with --momentum-correction), DDP with PowerSGD,
    or no communication."""
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    trained = powersgd_model(model, args.powersgd_rank) if args.peer == "powersgd" else model
    optimizer = make_optimizer(trained.parameters())
    if args.peer is None:
        if getattr(args, "momentum_correction", False) and hasattr(compression, "name_parameters"):
            compression.name_parameters(model.named_parameters(), optimizer=optimizer)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
    return trained, optimizer
