"""Command-line options that the training jobs and benchmarks share."""
import argparse


def compression_parser(doc, sparsifier="topk", value="auto"):
    """An ArgumentParser holding the compression options every job takes."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compression", choices=["deepreduce", "none", "fp16"], default="deepreduce",
                        help="deepreduce, or Horovod's own none / fp16 for comparison")
    parser.add_argument("--sparsifier", default=sparsifier, choices=["topk", "randomk", "threshold"])
    parser.add_argument("--ratio", type=float, default=0.01)
    parser.add_argument("--index", default="auto")
    parser.add_argument("--value", default=value)
    parser.add_argument("--memory", default="residual", choices=["residual", "none"])
    parser.add_argument("--warmup-steps", type=int, default=0,
                        help="density warm-up: from 25%% down to --ratio over this many steps")
    parser.add_argument("--fixed-density", action="store_true",
                        help="no Accordion critical phases: always select --ratio")
    parser.add_argument("--momentum-correction", action="store_true",
                        help="DGC's momentum correction, for the job's momentum-SGD optimizer")
    parser.add_argument("--momentum-masking", action="store_true",
                        help="with --momentum-correction: DGC's momentum factor masking")
    parser.add_argument("--energy", type=float, default=None,
                        help="share of each compensated gradient's energy top-k must carry "
                             "(up to 4x --ratio's count)")
    parser.add_argument("--local-clip-norm", type=float, default=None,
                        help="DGC's local gradient clipping: each rank's per-tensor L2 bound")
    parser.add_argument("--objective", default="time", choices=["time", "bytes"],
                        help="with an 'auto' codec: least predicted time (default) or fewest bytes")
    parser.add_argument("--collective", default="auto",
                        choices=["auto", "allgather", "sparse_allreduce"],
                        help="how sparse payloads travel (DeepReduce(collective=))")
    parser.add_argument("--lowrank", type=int, default=4,
                        help="rank of the low-rank factors a matrix may travel as (0: never)")
    parser.add_argument("--bandwidth", default=None,
                        help="the link, e.g. 1gbit (default: measured by a short calibration)")
    return parser


def add_digits_training_args(parser):
    """The options of the two digits jobs (PyTorch and TensorFlow), with the same defaults."""
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="rank 0 writes the per-epoch history here")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--baseline", help="--json history of a dense run (--compression none) "
                        "of the same length to compare with at the end (default: the one in docs/)")
    return parser


def add_synthetic_args(parser):
    """The options of the two synthetic benchmarks (PyTorch and TensorFlow)."""
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--warmup", type=int, default=46,
                        help="untimed steps (the planner's exploration, 15, and the step "
                             "guard's first comparison, up to 31)")
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--batches-per-iter", type=int, default=4,
                        help="timed steps: iters x batches-per-iter (one step varies by about "
                             "10%% here; 16 steps keep the mean within a few %%)")
    parser.add_argument("--json", help="rank 0 writes the result here")
    return parser


def pipeline_config(args):
    """DeepReduce keyword arguments from the parsed options."""
    return dict(sparsifier=args.sparsifier, ratio=args.ratio, index=args.index, value=args.value,
                memory=None if args.memory == "none" else "residual", objective=args.objective,
                bandwidth=args.bandwidth, warmup_steps=args.warmup_steps,
                collective=args.collective, momentum_masking=args.momentum_masking,
                local_clip_norm=args.local_clip_norm, adaptive_density=not args.fixed_density,
                lowrank=args.lowrank, energy=args.energy)
