"""Horovod's synthetic benchmark in TensorFlow, in the shape of its
examples/tensorflow2/tensorflow2_synthetic_benchmark.py: tf-keras' ResNet-50 (weights=None) on
random 224x224 images, DistributedGradientTape in a tf.function, images per second.

    horovodrun -np 2 -H localhost:2 --gloo python tf/synthetic_benchmark.py \\
        --compression deepreduce          (the default DeepReduce(); none / fp16: Horovod's own)

The first --warmup steps are not timed; they cover tracing and the time-aware planner's
calibration. Rank 0 prints img/s (the sum over ranks of each rank's mean).
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

from train_digits import make_compression  # noqa: E402  (tf/train_digits.py, beside this file;
from options import add_synthetic_args, compression_parser  # noqa: E402     it puts torch/'s shared helpers on the path)
from history import save_synthetic  # noqa: E402


def main():
    parser = add_synthetic_args(compression_parser(__doc__))
    args = parser.parse_args()
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.random.set_seed(0)
    model = keras.applications.ResNet50(weights=None)
    optimizer = keras.optimizers.SGD(0.01 * hvd.size())
    compression = make_compression(args)
    data = tf.random.uniform([args.batch_size, 224, 224, 3])
    target = tf.random.uniform([args.batch_size], 0, 1000, dtype=tf.int64)

    @tf.function
    def step(first):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                target, model(data, training=True)))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)

    step(True)
    for _ in range(args.warmup - 1):
        step(False)
    rates = []
    for _ in range(args.iters):
        start = time.perf_counter()
        for _ in range(args.batches_per_iter):
            step(False)
        rates.append(args.batch_size * args.batches_per_iter / (time.perf_counter() - start))
    rates = hvd.allgather_object(float(np.mean(rates)))
    if hvd.rank() == 0:
        parameters = sum(np.prod(v.shape) for v in model.trainable_variables)
        save_synthetic(args.compression, rates, parameters, compression, args.json)

if __name__ == "__main__":
    main()
