"""Command-line options that the training jobs and benchmarks share."""
import argparse


def compression_parser(doc, sparsifier="topk", value="entropy"):
    """An ArgumentParser holding the compression options every job takes."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compression", choices=["deepreduce", "none", "fp16"], default="deepreduce",
                        help="deepreduce, or Horovod's own none / fp16 for comparison")
    parser.add_argument("--sparsifier", default=sparsifier, choices=["topk", "randomk", "threshold"])
    parser.add_argument("--ratio", type=float, default=0.01)
    parser.add_argument("--index", default="entropy")
    parser.add_argument("--value", default=value)
    parser.add_argument("--memory", default="residual", choices=["residual", "none"])
    return parser


def pipeline_config(args):
    """DeepReduce keyword arguments from the parsed options."""
    return dict(sparsifier=args.sparsifier, ratio=args.ratio, index=args.index, value=args.value,
                memory=None if args.memory == "none" else "residual")
