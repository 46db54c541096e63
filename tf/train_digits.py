"""Data-parallel training of a small CNN on scikit-learn's digits with Horovod's TensorFlow
DistributedGradientTape and DeepReduce (tf-keras layers, see the README on Keras 3).

    horovodrun -np 2 -H localhost:2 --gloo python tf/train_digits.py \\
        --compression deepreduce --index bloom --value qsgd
    ... --compression none | fp16      (Horovod's own, for comparison)
    ... --peer compute                  (no communication: the time floor)

Rank 0 shows a progress bar and prints, per epoch, the training loss, test accuracy and the
megabytes this rank sent against what a dense fp32 allreduce of the same gradients carries,
then a closing line against the dense run recorded in docs/digits_dense_tf.json.
"""
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Horovod 0.28.1 needs Keras 2 variables
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch"))  # the jobs' shared helpers
from options import add_digits_training_args, compression_parser, pipeline_config  # noqa: E402
from history import History  # noqa: E402
from deepreduce_hvd.tensorflow import DeepReduce  # noqa: E402

# the dense run that the closing line compares with (`make demo-baseline` records it)
BASELINE = Path(__file__).resolve().parent.parent / "docs" / "digits_dense_tf.json"
MOMENTUM = 0.9


def parse_args():
    parser = compression_parser(__doc__)
    parser.add_argument("--model", default="convnet", choices=sorted(MODELS))
    parser.add_argument("--peer", choices=["compute"],
                        help="no communication (the time floor): each rank steps on its own gradient")
    return add_digits_training_args(parser).parse_args()


def digits_split(seed, test_fraction=0.2):
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[..., None]
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], data.target[train], x[test], data.target[test]


def convnet():
    return keras.Sequential([
        keras.layers.Conv2D(32, 3, padding="same", activation="relu", input_shape=(8, 8, 1)),
        keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10)])


def cnn():
    """The CNN of the time-to-accuracy runs (torch/digits.py's DigitsCNN)."""
    return keras.Sequential([
        keras.layers.Conv2D(32, 3, padding="same", activation="relu", input_shape=(8, 8, 1)),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10)])


MODELS = {"convnet": convnet, "cnn": cnn}


def make_compression(args):
    if args.compression == "none":
        return hvd.Compression.none
    if args.compression == "fp16":
        return hvd.Compression.fp16
    return DeepReduce(**pipeline_config(args), momentum=MOMENTUM if args.momentum_correction else 0.0)


def main():
    args = parse_args()
    hvd.init()
    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_test, y_test = digits_split(args.seed)
    shard = len(y_train) // hvd.size()  # equal shards: every rank takes the same number of steps
    x_train = x_train[hvd.rank()::hvd.size()][:shard]
    y_train = y_train[hvd.rank()::hvd.size()][:shard]
    model = MODELS[args.model]()
    optimizer = keras.optimizers.SGD(args.lr, momentum=MOMENTUM)
    compression = None if args.peer == "compute" else make_compression(args)  # None: no tape reduces
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y, first):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        if compression is not None:
            tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return loss

    dense_per_step = 4 * sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    steps_per_epoch = len(y_train) // args.batch_size
    generator = np.random.default_rng(args.seed + hvd.rank())
    history, steps = History(hvd.rank(), args.json, {**vars(args), "ranks": hvd.size()}), 0
    for epoch in range(1, args.epochs + 1):
        order = generator.permutation(len(y_train))
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch}/{args.epochs}", leave=False,
                   disable=hvd.rank() != 0 or args.no_progress)
        losses, start = [], time.perf_counter()
        for step in bar:
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            loss = train_step(x_train[batch], y_train[batch], tf.constant(steps == 0 and step == 0))
            losses.append(float(loss))
            bar.set_postfix(loss=f"{float(loss):.3f}")
        steps += steps_per_epoch
        if isinstance(compression, DeepReduce):
            stats = compression.stats()
            sent, dense = stats["bytes_sent"], stats["dense_bytes"]
        else:
            dense = dense_per_step * steps
            sent = 0 if compression is None else \
                dense // 2 if compression is hvd.Compression.fp16 else dense
        accuracy = float(np.mean(np.argmax(model(x_test, training=False), 1) == y_test))
        loss = float(hvd.allreduce(tf.constant(np.mean(losses))))
        history.add(epoch, {"loss": loss, "test_accuracy": accuracy}, sent, dense,
                    time.perf_counter() - start)
    history.compare(args.baseline or BASELINE)
    history.save()


if __name__ == "__main__":
    main()
