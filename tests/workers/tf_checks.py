"""Checks of deepreduce_hvd.tensorflow on real Horovod ranks; run by tests/test_tf_horovod.py.

Checks are the check_* functions (tests/workers/harness.py records each rank's outcome).
"""
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

import deepreduce_hvd as dr
import harness
from deepreduce_hvd.tensorflow import DeepReduce

hvd.init()
harness.bind(hvd)
rank, size = hvd.rank(), hvd.size()
rng = np.random.default_rng(100 + rank)


def local_average(dense, ratio):
    values, indices = dr.topk(dense, ratio)
    mine = dr.densify(values, indices, dense.shape)
    return np.mean(hvd.allgather_object(mine), axis=0)


def check_eager():
    t = tf.constant(rng.standard_normal((50, 60)), tf.float32)
    for op in (hvd.Average, hvd.Sum):
        got = hvd.allreduce(t, op=op, compression=DeepReduce(sparsifier="none", index="entropy",
                                                             value="raw"))
        np.testing.assert_allclose(got.numpy(), hvd.allreduce(t, op=op).numpy(), rtol=1e-6, atol=1e-6)
    got = hvd.allreduce(t, compression=DeepReduce(ratio=0.05, index="entropy", value="raw",
                                                  adaptive_density=False))  # exactly top-5%
    np.testing.assert_allclose(got.numpy(), local_average(t.numpy(), 0.05), rtol=1e-6, atol=1e-7)
    ints = tf.range(5000) * (rank + 1)
    compression = DeepReduce(ratio=0.05, index="entropy", value="raw")
    np.testing.assert_array_equal(hvd.allreduce(ints, op=hvd.Sum, compression=compression).numpy(),
                                  hvd.allreduce(ints, op=hvd.Sum).numpy())
    assert compression.stats()["tensors_passed_through"] == 1


def check_lowrank_eager():
    """Eagerly, a named matrix on a slow link travels as low-rank factors: a sum of rank-1
    gradients arrives exactly, the same bits on every rank."""
    u = np.random.default_rng(5).standard_normal(96).astype(np.float32)
    v = np.random.default_rng(6).standard_normal(80).astype(np.float32)
    compression = DeepReduce(bandwidth="10mbit", lowrank=1)
    got = hvd.allreduce(tf.constant((rank + 1) * np.outer(u, v)), name="rank1",
                        compression=compression).numpy()
    np.testing.assert_allclose(got, (size + 1) / 2 * np.outer(u, v), rtol=1e-4, atol=1e-4)
    assert compression.stats()["tensors_lowrank"] == 1, compression.stats()
    for other in hvd.allgather_object(got)[1:]:
        np.testing.assert_array_equal(got, other)


def check_tf_function():
    t = tf.constant(rng.standard_normal((40, 70)), tf.float32)
    compression = DeepReduce(ratio=0.05, index="golomb", value="raw", memory=None,
                             adaptive_density=False)

    @tf.function
    def reduce(x):
        return hvd.allreduce(x, compression=compression)

    for _ in range(2):  # the traced function runs twice: encode/decode happen at run time
        np.testing.assert_allclose(reduce(t).numpy(), local_average(t.numpy(), 0.05),
                                   rtol=1e-6, atol=1e-7)
    assert compression.stats()["tensors_compressed"] == 2


def check_gradient_tape():
    tf.random.set_seed(0)
    w1 = tf.Variable(tf.random.normal((30, 64), seed=1), name="w1")
    w2 = tf.Variable(tf.random.normal((64, 4), seed=2), name="w2")
    compression = DeepReduce(ratio=0.1, index="entropy", value="qsgd", memory="residual", min_size=100)
    opt = tf.optimizers.SGD(0.05)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ w1) @ w2))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, [w1, w2])
        opt.apply_gradients(zip(grads, [w1, w2]))
        return loss

    for _ in range(4):
        step(tf.constant(rng.standard_normal((16, 30)), tf.float32))
    for w in (w1, w2):
        copies = hvd.allgather_object(w.numpy())
        for other in copies[1:]:
            np.testing.assert_array_equal(copies[0], other)
    assert len(compression.pipeline.memory.names()) == 2  # one residual per variable
    stats = compression.stats()
    assert stats["tensors_compressed"] == 8 and stats["bytes_sent"] < stats["dense_bytes"], stats
    # every tensor went by allgather: this rank received the other ranks' frames, all of them
    sent = hvd.allgather_object(stats["bytes_sent"])
    assert stats["bytes_received"] == sum(sent) - stats["bytes_sent"] > 0, (stats, sent)


def check_mismatch():
    t = tf.constant(rng.standard_normal((40, 40)), tf.float32)
    other = dict(ratio=0.05, index="golomb" if rank else "entropy", value="raw")
    try:  # eagerly, tf.numpy_function re-raises the DeepReduceError itself
        hvd.allreduce(t, compression=DeepReduce(**other))
        raise AssertionError("no error in eager mode")
    except dr.DeepReduceError as exc:
        assert "config" in str(exc), str(exc)
    compression = DeepReduce(**other)
    reduce = tf.function(lambda x: hvd.allreduce(x, compression=compression))
    try:  # in a graph, TF wraps it in an OpError that names it
        reduce(t)
        raise AssertionError("no error in graph mode")
    except tf.errors.OpError as exc:
        assert "DeepReduceError" in exc.message and "config" in exc.message, exc.message


def check_keras_fit():
    import tf_keras as keras
    import horovod.tensorflow.keras as hvd_keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Dense(64, activation="relu", input_shape=(20,)),
                              keras.layers.Dense(3)])
    compression = DeepReduce(ratio=0.1, min_size=100, index="entropy", value="qsgd")
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=compression)
    model.compile(opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = rng.standard_normal((64, 20)).astype(np.float32)
    y = rng.integers(0, 3, 64)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    for w in model.get_weights():
        copies = hvd.allgather_object(w)
        for other in copies[1:]:
            np.testing.assert_array_equal(copies[0], other)
    assert compression.stats()["tensors_compressed"] > 0


def check_keras3_gradients():
    import keras
    from deepreduce_hvd.tensorflow import allreduce_gradients
    assert keras.__version__.startswith("3"), keras.__version__
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(3)])
    opt = keras.optimizers.SGD(0.05)
    compression = DeepReduce(ratio=0.1, min_size=100, index="entropy", value="qsgd")

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x), from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(allreduce_gradients(grads, model.trainable_variables,
                                                    compression), model.trainable_variables))

    for _ in range(3):
        step(rng.standard_normal((16, 20)).astype(np.float32), rng.integers(0, 3, 16))
    for w in model.get_weights():
        copies = hvd.allgather_object(w)
        for other in copies[1:]:
            np.testing.assert_array_equal(copies[0], other)
    assert compression.stats()["tensors_compressed"] == 6  # two kernels, three steps


def check_device_path():
    """Compensation and selection as TF ops in the graph (device_path=True, here on the CPU)
    train to exactly the variables the native host path gives. min_size=0 sends every tensor
    through DeepReduce: Horovod's own dense ring sum order depends on fusion timing."""
    results = []
    for device_path in (True, False):
        tf.random.set_seed(0)
        w1 = tf.Variable(tf.random.normal((30, 64), seed=1))
        w2 = tf.Variable(tf.random.normal((64, 4), seed=2))
        compression = DeepReduce(ratio=0.1, index="entropy", value="entropy", min_size=0,
                                 device_path=device_path)
        opt = tf.optimizers.SGD(0.05)
        data = np.random.default_rng(7 + rank)

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ w1) @ w2))
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            opt.apply_gradients(zip(tape.gradient(loss, [w1, w2]), [w1, w2]))

        for _ in range(4):
            step(tf.constant(data.standard_normal((16, 30)), tf.float32))
        results.append([w1.numpy(), w2.numpy()])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def traced_tape_steps(compression, steps, record):
    """`steps` SGD steps of a two-layer model in a tf.function tape reduced with `compression`
    -> (the traced step, record(its stats) after each step); the records and the variables
    are checked identical on every rank."""
    tf.random.set_seed(0)
    w1 = tf.Variable(tf.random.normal((64, 256), seed=1), name="w1")
    w2 = tf.Variable(tf.random.normal((256, 4), seed=2), name="w2")
    opt = tf.optimizers.SGD(0.01)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ w1) @ w2))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        opt.apply_gradients(zip(tape.gradient(loss, [w1, w2]), [w1, w2]))

    history = []
    for _ in range(steps):
        compression.reset_stats()
        step(tf.constant(rng.standard_normal((16, 64)), tf.float32))
        history.append(record(compression.stats()))
    for other in hvd.allgather_object(history)[1:]:
        assert other == history, (history, other)
    for w in (w1, w2):
        copies = hvd.allgather_object(w.numpy())
        for other in copies[1:]:
            np.testing.assert_array_equal(copies[0], other)
    return step, history


def check_time_aware():
    """The default DeepReduce in a traced tape: every rank makes the same choices, variables
    stay identical, and on a slow link the big gradient takes the allgather."""
    _, history = traced_tape_steps(DeepReduce(bandwidth="10mbit"), 20, lambda stats: {
        n: t["choice"] for n, t in stats["tensors"].items()})
    assert any("+" in c for c in history[-1].values()), history[-1]


def check_step_guard_in_a_traced_tape():
    """In a tf.function tape the step guard still acts: once the planner settled, 3 steps
    the traced way (the big gradient sparse on a slow link), 3 with every gradient traced
    sparse sent by Horovod's fp16 allreduce, 5 by fp32, 3 by fp16 and 3 the traced way again,
    one verdict on every rank, then the winner runs; variables stay identical. After an elastic reset it stays out of graphs."""
    compression = DeepReduce(bandwidth="10mbit")
    step, history = traced_tape_steps(compression, 38, lambda stats: (
        stats["tensors_compressed"], stats["guard"]["global"]))
    start = compression.comm.sets["global"].policy.planner.settled_after + 1
    guard = history[-1][1]
    assert set(guard["compared_ms"]) == {"planned", "allreduce_fp16", "allreduce"}, guard
    planned, dense = history[start - 1:start + 2], history[start + 2:start + 13]
    assert all(compressed > 0 for compressed, _ in planned), history
    assert all(compressed == 0 for compressed, _ in dense), history
    assert all((compressed > 0) == (guard["winner"] == "planned")
               for compressed, _ in history[start + 16:]), (guard, history)
    # the dense arms deliver the average (the sum scaled by Horovod's reduced placeholder)
    plain = DeepReduce(bandwidth="10mbit", memory=None)
    reduce = tf.function(lambda x: hvd.allreduce(x, compression=plain, name="guarded"))
    x = rng.standard_normal((64, 256)).astype(np.float32)
    average = np.mean(hvd.allgather_object(x), axis=0)
    delivered = []
    for _ in range(start + 8):
        plain.reset_stats()
        got = reduce(tf.constant(x)).numpy()
        delivered.append((plain.stats()["tensors_compressed"], got))
    for offset, tolerance in ((2, 1e-3), (5, 1e-6)):  # fp16's steps, then fp32's
        for step_index in range(start + offset, start + offset + 3):
            compressed, got = delivered[step_index]
            assert compressed == 0, (step_index, compressed)
            np.testing.assert_allclose(got, average, rtol=tolerance, atol=tolerance)
    # after an elastic reset graphs are not traced again and a joining rank traces afresh:
    # no graph, old or new, is guarded from then on (a new guard's schedule would be another)
    compression.comm.rejoin()
    again = tf.function(step.python_function)
    for _ in range(start + 9):
        compression.reset_stats()
        again(tf.constant(rng.standard_normal((16, 64)), tf.float32))
        assert compression.stats()["tensors_compressed"] > 0, compression.stats()


def check_momentum_correction_in_a_traced_tape():
    """DeepReduce(momentum=0.9) in a tf.function tape hands the optimizer exactly what the
    numpy pipelines of every rank compute: each rank's velocity top-k, the average in rank
    order, D_t - 0.9 D_{t-1} (bit for bit, over steps whose selections move)."""
    shape, steps = (50, 100), 6
    config = dict(ratio=0.05, index="raw", value="raw", min_size=0, momentum=0.9,
                  adaptive_density=False)
    grads = [[np.random.default_rng(1000 * r + s).standard_normal(shape).astype(np.float32)
              for s in range(steps)] for r in range(size)]
    w = tf.Variable(tf.zeros(shape), name="mc_w")
    compression = DeepReduce(**config)

    @tf.function
    def handed(g):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * g)
        return hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, [w])[0]

    references = [dr.Pipeline(**config) for _ in range(size)]
    for s in range(steps):
        got = handed(tf.constant(grads[rank][s])).numpy()
        frames = b"".join(p.compress("w", grads[r][s]) for r, p in enumerate(references))
        total, _ = references[0].decompress(frames, shape, "float32", size, name="w",
                                            scale=1.0 / size)
        np.testing.assert_array_equal(got, references[0].momentum.for_optimizer("w", total))
    assert compression.stats()["tensors_compressed"] == steps

if __name__ == "__main__":
    harness.main(globals())
