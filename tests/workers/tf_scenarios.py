"""Horovod 0.28.1's own TensorFlow and Keras optimizer scenarios (test/parallel/
test_tensorflow.py, test_tensorflow_process_sets.py, test_tensorflow2_keras.py,
test_tensorflow2_keras_process_sets.py) on real ranks, each run twice in this worker: with
Horovod's dense allreduce and with a lossless DeepReduce. The two runs must agree (rtol 1e-5:
DeepReduce sums ranks in rank order, Horovod's ring in its own), ranks that reduce together
must hold identical values, and where Horovod's test knows the exact answer, both must give it.
Run by tests/test_horovod_scenarios.py.

Keras is tf-keras (Horovod 0.28.1 predates Keras 3): TF_USE_LEGACY_KERAS=1 before TensorFlow.
Process sets: even ranks [0, 2, ...] and odd ranks [1, 3, ...], registered at hvd.init (or,
with HOROVOD_DYNAMIC_PROCESS_SETS=1, added after it with hvd.add_process_set). On 2 ranks each
is a 1-rank set, which Horovod's TF ops skip; the checks bite on 4.

Each scenario is a check_* function (tests/workers/harness.py runs them, records each rank's
outcome and ends the worker when one raises or hangs).
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvd_keras  # noqa: E402

import harness  # noqa: E402
from deepreduce_hvd.tensorflow import DeepReduce  # noqa: E402
from harness import DENSE, assert_close, assert_compressed, both, same_within  # noqa: E402

keras = tf.keras
assert keras.__name__.startswith("tf_keras"), keras.__name__  # TF_USE_LEGACY_KERAS took effect

EVEN, ODD = harness.init_with_process_sets(hvd)
rank, size = hvd.rank(), hvd.size()
harness.bind(hvd)
THIS_SET = EVEN if rank % 2 == 0 else ODD
RTOL, ATOL = 1e-5, 1e-6
KINDS = (DENSE, "deepreduce")


def lossless():
    """Every float tensor (min_size=1) exactly through DeepReduce's sparse allgather."""
    return DeepReduce(sparsifier="none", index="entropy", value="raw", min_size=1)


def compression_for(kind):
    return hvd.Compression.none if kind == DENSE else lossless()


SET_GROUPS = [EVEN.ranks, ODD.ranks]


def reduces(process_set):
    """Horovod's TF ops reduce over a set this rank is in, when it has more than one rank."""
    return process_set.included() and process_set.size() > 1


def set_mean(values_of_rank, process_set):
    """What an average over `process_set` gives this rank (its own value outside the set or in
    a 1-rank set)."""
    if not reduces(process_set):
        return values_of_rank(rank)
    return np.mean([values_of_rank(r) for r in process_set.ranks], axis=0)


# ---------------------------------------------------------------------------------------------
# process sets: DistributedGradientTape(process_set=), allreduce(process_set=)
# (test_distributed_gradient_tape_process_sets, test_horovod_allreduce_cpu_process_sets)
# ---------------------------------------------------------------------------------------------

def tape_training(kind, process_set, function, steps=3, distributed=True, **tape_kwargs):
    """A two-layer net trained by hand (w -= 0.1 * g) with DistributedGradientTape (or, not
    distributed, a plain tape)."""
    rng = np.random.default_rng(0)
    w1 = tf.Variable(rng.standard_normal((20, 8)).astype(np.float32), name="w1")
    w2 = tf.Variable(rng.standard_normal((8, 3)).astype(np.float32), name="w2")
    b = tf.Variable(np.zeros(3, np.float32), name="b")
    compression = compression_for(kind)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ w1) @ w2 + b - y))
        if distributed:
            tape = hvd.DistributedGradientTape(tape, compression=compression,
                                               process_set=process_set, **tape_kwargs)
        grads = tape.gradient(loss, [w1, w2, b])
        for v, g in zip((w1, w2, b), grads):
            v.assign_sub(0.1 * g)
        return loss

    step = tf.function(step) if function else step
    data = np.random.default_rng(100 + rank)
    for _ in range(steps):
        step(tf.constant(data.standard_normal((16, 20)), tf.float32),
             tf.constant(data.standard_normal((16, 3)), tf.float32))
    return {"w1": w1.numpy(), "w2": w2.numpy(), "b": b.numpy()}, compression


def check_grouped_allreduce_process_sets():
    """hvd.grouped_allreduce(process_set=) with DeepReduce, eagerly and in tf.function, named
    and unnamed, members of different and of equal shapes. Every case runs (each does the same
    collectives on every rank whatever happens); the failures are listed together."""
    rng = np.random.default_rng(11 + rank)
    failures = []
    for ps_name, ps in (("this", THIS_SET), ("global", hvd.global_process_set)):
        for shapes in (((20,), (3, 4)), ((6, 5), (6, 5), (30,))):
            for named in (True, False):
                for function in (False, True):
                    tag = f"{ps_name}.{len(shapes)}.{named}.{function}"
                    tensors = [tf.constant(rng.standard_normal(s).astype(np.float32))
                               for s in shapes]

                    def reduce(ts, compression, name):
                        return hvd.grouped_allreduce(ts, process_set=ps, compression=compression,
                                                     name=name if named else None)
                    if function:
                        reduce = tf.function(reduce)
                    want = reduce(tensors, hvd.Compression.none, f"gdense.{tag}")
                    try:
                        got = reduce(tensors, lossless(), f"gdr.{tag}")
                        for i, (w, g) in enumerate(zip(want, got)):
                            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=ATOL,
                                                       err_msg=f"member {i}")
                    except Exception as exc:  # noqa: BLE001 -- listed below
                        failures.append(f"process_set={ps_name} {ps.ranks} shapes={shapes} "
                                        f"named={named} tf.function={function}: "
                                        f"{type(exc).__name__}: {str(exc).strip()[:300]}")
    assert not failures, "\n".join(failures)


def check_gradient_tape_process_sets():
    """Horovod's test (d(x*x)/dx averaged over the even set, every rank calling) and training
    with DistributedGradientTape(process_set=): the even set for everyone (odd ranks train
    alone), then each rank on its own set (both sets reduce at once), eagerly and in
    tf.function, plain and with op=Sum / num_groups."""
    for kind in KINDS:
        compression = compression_for(kind)
        x = tf.constant(float(rank) + 0.5)
        with tf.GradientTape() as g:
            g.watch(x)
            y = x * x
        value, = hvd.DistributedGradientTape(g, process_set=EVEN, compression=compression
                                             ).gradient(y, [x])
        want = set_mean(lambda r: 2.0 * (r + 0.5), EVEN)
        np.testing.assert_allclose(value.numpy(), want, rtol=1e-6, err_msg=kind)
    variants = [("even", False, {}), ("even", True, {}), ("own", False, {}), ("own", True, {}),
                ("own", True, dict(op=hvd.Sum)), ("own", False, dict(num_groups=2)),
                ("own", True, dict(num_groups=2)), ("even", True, dict(num_groups=2))]
    for which, function, kwargs in variants:  # (EVEN is THIS_SET on even ranks: go by label)
        process_set = EVEN if which == "even" else THIS_SET
        what = f"tape {which} set {process_set.ranks} function={function} {kwargs}"
        (dense, _), (drr, compression) = both(
            lambda kind: tape_training(kind, process_set, function, **kwargs))
        assert_close(dense, drr, what)
        assert_compressed(compression, what, expected=reduces(process_set))
        members = process_set.ranks
        local, _ = tape_training(DENSE, process_set, function, distributed=False)
        if reduces(process_set):
            assert any(not np.allclose(local[k], drr[k]) for k in local), what
        else:  # outside the set, or a 1-rank set: Horovod leaves the rank to train alone
            assert_close(local, drr, what + " (not reduced)")
        same_within(drr, what, groups=[members] if rank in members else [[rank]])
        if size >= 4 and which == "own":  # the two sets reduced different data
            everyone = hvd.allgather_object(drr["w2"])
            assert not np.allclose(everyone[0], everyone[1]), what


def check_allreduce_process_sets():
    """hvd.allreduce(process_set=) with DeepReduce, eagerly and in tf.function, Average and Sum:
    equal to dense and to the mean/sum over the set."""
    rng = np.random.default_rng(7 + rank)
    for op in (hvd.Average, hvd.Sum):
        for shape in ((33, 7), (1,), (5,)):
            value = rng.standard_normal(shape).astype(np.float32)
            mine = hvd.allgather_object(value)
            for ps_name, ps in (("this", THIS_SET), ("global", hvd.global_process_set)):
                tag = f"{ps_name}.{op}.{'x'.join(map(str, shape))}"
                members = ps.ranks if reduces(ps) else [rank]
                exact = np.sum([mine[r] for r in members], axis=0)
                exact = exact / len(members) if op == hvd.Average else exact
                for function in (False, True):
                    def reduce(t, compression, name):
                        return hvd.allreduce(t, op=op, process_set=ps, name=name,
                                             compression=compression)
                    if function:
                        reduce = tf.function(reduce)
                    t = tf.constant(value)
                    want = reduce(t, hvd.Compression.none, f"dense.{tag}.{function}")
                    compression = lossless()
                    got = reduce(t, compression, f"dr.{tag}.{function}")
                    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL,
                                               err_msg=f"{tag} function={function}")
                    np.testing.assert_allclose(got.numpy(), exact, rtol=RTOL, atol=ATOL,
                                               err_msg=f"{tag} function={function} exact")
                    assert_compressed(compression, tag)
                    same_within({"t": got.numpy()}, tag,
                                       groups=SET_GROUPS if ps_name == "this" else None)
    t = tf.constant(rng.standard_normal(40).astype(np.float32))
    explicit = DeepReduce(sparsifier="none", index="entropy", value="raw", min_size=1,
                          process_set=THIS_SET)
    np.testing.assert_allclose(
        hvd.allreduce(t, process_set=THIS_SET, name="explicit", compression=explicit).numpy(),
        hvd.allreduce(t, process_set=THIS_SET, name="explicit.dense").numpy(), rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------------------------------
# legacy tf.compat.v1 DistributedOptimizer in graph mode: test_local_gradient_aggregation
# (dense and sparse) and test_legacy_DistributedOptimizer_process_sets
# ---------------------------------------------------------------------------------------------

GRAD_SIZE = 12


def rank_gradient(r):
    return (r + np.arange(GRAD_SIZE) / 10.0).astype(np.float32)


def legacy_graph_run(kind, backward_passes_per_step=1, sparse=False, process_set=None, steps=10):
    """The variable's value after each of `steps` session runs of compute + apply, with a
    TestOptimizer whose gradient is rank_gradient(rank) and whose update is var += grad."""
    process_set = process_set or hvd.global_process_set
    compression = compression_for(kind)
    values = []
    with tf.Graph().as_default():
        class TestOptimizer(tf.compat.v1.train.Optimizer):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.variable = tf.Variable(np.zeros(GRAD_SIZE, np.float32))

            def compute_gradients(self, *args, **kwargs):
                grad = tf.constant(rank_gradient(rank))
                if sparse:
                    grad = tf.IndexedSlices(grad, tf.range(GRAD_SIZE), tf.constant([GRAD_SIZE]))
                return [(grad, self.variable)]

            def _apply_dense(self, grad, var):
                return var.assign_add(grad)

            def _resource_apply_dense(self, grad, var):
                return var.assign_add(grad)

        opt = hvd.DistributedOptimizer(
            optimizer=TestOptimizer(name=f"test_{kind}", use_locking=False),
            backward_passes_per_step=backward_passes_per_step, average_aggregated_gradients=True,
            sparse_as_dense=sparse, compression=compression, process_set=process_set)
        grads_and_vars = opt.compute_gradients()
        update = opt.apply_gradients(grads_and_vars)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(tf.compat.v1.local_variables_initializer())
            for _ in range(steps):
                sess.run(update)
                values.append(sess.run(opt._optimizer.variable.read_value()))
    return {"values": np.array(values)}, compression


def check_local_gradient_aggregation():
    passes = 4
    for sparse in (False, True):
        what = f"local_gradient_aggregation sparse={sparse}"
        (dense, _), (drr, compression) = both(
            lambda kind: legacy_graph_run(kind, passes, sparse=sparse))
        assert_close(dense, drr, what)
        assert_compressed(compression, what)
        mean = set_mean(rank_gradient, hvd.global_process_set)
        expected = np.array([(i + 1) // passes * mean for i in range(10)])  # averaged passes
        np.testing.assert_allclose(drr["values"], expected, rtol=RTOL, atol=ATOL, err_msg=what)
        same_within(drr, what)
    for process_set in (EVEN, THIS_SET):
        what = f"legacy optimizer process_set={process_set.ranks}"
        (dense, _), (drr, compression) = both(
            lambda kind: legacy_graph_run(kind, process_set=process_set, steps=3))
        assert_close(dense, drr, what)
        mean = set_mean(rank_gradient, process_set)
        np.testing.assert_allclose(drr["values"], [mean * (i + 1) for i in range(3)],
                                   rtol=RTOL, atol=ATOL, err_msg=what)


# ---------------------------------------------------------------------------------------------
# test_partial_distributed_gradient_tape, test_model_parallel_model
# ---------------------------------------------------------------------------------------------

def rank_model():
    """Horovod's test model, each rank's weights set to its rank (so reduced gradients differ
    from local ones), a bit wider so every kernel is worth sending."""
    init = keras.initializers.Constant(rank + 1)
    return keras.models.Sequential([
        keras.layers.Dense(4, input_shape=(3,), kernel_initializer=init, bias_initializer=init),
        keras.layers.RepeatVector(3),
        keras.layers.TimeDistributed(keras.layers.Dense(3, kernel_initializer=init,
                                                        bias_initializer=init))])


def check_partial_distributed_gradient_tape():
    rng = np.random.default_rng(rank)
    X = rng.random((2, 3)).astype(np.float32)
    Y = rng.random((2, 3, 3)).astype(np.float32)
    for num_local_layers in range(3):
        model = rank_model()
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_mean(keras.losses.MSE(Y, model(X, training=True)))
        weights = model.trainable_weights
        local_grads = {w.ref(): g.numpy() for w, g in zip(weights, tape.gradient(loss, weights))}
        local_layers = model.layers[:num_local_layers]
        local_refs = {w.ref() for layer in local_layers for w in layer.trainable_weights}
        results = {}
        for kind in KINDS:
            compression = compression_for(kind)
            partial = hvd.PartialDistributedGradientTape(tape, local_layers=local_layers,
                                                         compression=compression)
            reduced = partial.gradient(loss, weights)
            local_pairs, global_pairs = partial.get_local_and_global_gradients(loss, weights)
            assert len(local_pairs) == len(local_refs), (len(local_pairs), len(local_refs))
            out = {}
            for i, (w, g) in enumerate(zip(weights, reduced)):
                g = g.numpy()
                if w.ref() in local_refs:  # kept local, scaled by 1/size
                    np.testing.assert_allclose(g, local_grads[w.ref()] / size, rtol=1e-6)
                else:  # reduced: not the local gradient, since every rank's weights differ
                    assert not np.allclose(g, local_grads[w.ref()]), (kind, i)
                out[f"gradient.{i}"] = g
            for i, (w, g) in enumerate(local_pairs + global_pairs):
                out[f"pairs.{i}"] = g.numpy()
            results[kind] = out
            if kind != DENSE:
                assert_compressed(compression, f"partial tape {num_local_layers}")
        what = f"partial tape, {num_local_layers} local layers"
        assert_close(results[DENSE], results["deepreduce"], what)
        shared = {f"gradient.{i}": results["deepreduce"][f"gradient.{i}"]
                  for i, w in enumerate(weights) if w.ref() not in local_refs}
        same_within(shared, what)
        del tape


def check_model_parallel():
    """Horovod's model-parallel test on any number of ranks: each rank holds its own embedding
    table (a local source of the tape), rows travel by alltoall to a dense layer whose
    gradient is reduced."""
    width = 8

    def run(kind):
        vocab = 5 + 2 * rank
        emb = tf.Variable(np.full((vocab, width), rank + 1.0, np.float32)
                          + np.arange(vocab * width, dtype=np.float32).reshape(vocab, width) / 100,
                          name="embedding")
        kernel = tf.Variable(np.linspace(-0.5, 0.5, size * width, dtype=np.float32)
                             .reshape(size * width, 1), name="kernel")
        compression = compression_for(kind)
        labels = tf.ones([1, 1])

        @tf.function
        def step(inputs):
            with tf.GradientTape() as tape:
                rows = tf.gather(emb, inputs)              # this rank's rows, one per rank
                gathered = hvd.alltoall(rows)              # row j from rank j's table
                logits = tf.reshape(gathered, [1, size * width]) @ kernel
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            tape.register_local_source(emb)
            g_emb, g_kernel = tape.gradient(loss, [emb, kernel])
            emb.assign_sub(tf.convert_to_tensor(g_emb))
            kernel.assign_sub(g_kernel)
            return loss

        dp_inputs = tf.constant([(rank + j) % 5 for j in range(size)], tf.int64)
        mp_inputs = hvd.alltoall(dp_inputs, name=f"mp_inputs.{kind}")  # data- to model-parallel
        for _ in range(3):
            step(mp_inputs)
        return {"embedding": emb.numpy(), "kernel": kernel.numpy()}, compression

    (dense, _), (drr, compression) = both(run)
    assert_close(dense, drr, "model_parallel")
    assert_compressed(compression, "model_parallel")
    same_within({"kernel": drr["kernel"]}, "model_parallel")


# ---------------------------------------------------------------------------------------------
# Keras (tf-keras): test_sparse_as_dense(_with_grad_aggregation), test_gradient_aggregation,
# test_from_config, test_partial_distributed_optimizer, test_process_set_optimizer
# ---------------------------------------------------------------------------------------------

def keras_weights(model):
    return {f"{i}": w for i, w in enumerate(model.get_weights())}


def check_keras_sparse_as_dense():
    """An Embedding model (IndexedSlices gradients densified, then reduced by DeepReduce), with
    and without local gradient aggregation (backward_passes_per_step=2)."""
    rng = np.random.default_rng(rank)
    x = rng.integers(0, 200, size=(16, 10))
    y = rng.random((16, 10, 16)).astype(np.float32)
    for passes, steps in ((1, 2), (2, 3)):
        def run(kind):
            keras.utils.set_random_seed(0)
            compression = compression_for(kind)
            opt = hvd_keras.DistributedOptimizer(keras.optimizers.RMSprop(learning_rate=0.01),
                                                 sparse_as_dense=True, compression=compression,
                                                 backward_passes_per_step=passes)
            model = keras.models.Sequential([keras.layers.Embedding(200, 16, input_length=10)])
            model.compile(loss=keras.losses.mean_squared_error, optimizer=opt)
            for _ in range(steps):
                model.train_on_batch(x, y)
            if passes > 1:
                assert opt._agg_helper.counter.numpy() == steps % passes
            return keras_weights(model), compression

        what = f"keras sparse_as_dense passes={passes}"
        (dense, _), (drr, compression) = both(run)
        assert_close(dense, drr, what)
        same_within(drr, what)


def check_sparse_as_dense_compressed():
    """With sparse_as_dense=True the densified embedding gradient is a dense float tensor:
    DeepReduce must encode it (not pass it through to Horovod's allreduce), in the Keras
    DistributedOptimizer (model.train_on_batch) and in DistributedGradientTape (eagerly and in
    tf.function). Horovod densifies inside its own tf.function, where the tensor's static shape
    is unknown."""
    rng = np.random.default_rng(rank)
    x = rng.integers(0, 200, size=(16, 10))
    y = rng.random((16, 10, 16)).astype(np.float32)
    failures = []
    keras.utils.set_random_seed(0)
    compression = lossless()
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.RMSprop(learning_rate=0.01),
                                         sparse_as_dense=True, compression=compression)
    model = keras.models.Sequential([keras.layers.Embedding(200, 16, input_length=10)])
    model.compile(loss=keras.losses.mean_squared_error, optimizer=opt)
    model.train_on_batch(x, y)
    failures.append(("keras DistributedOptimizer", compression.stats()))
    for function in (False, True):
        table = tf.Variable(np.ones((50, 8), np.float32))
        compression = lossless()

        def grad(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.gather(table, ids))
            tape = hvd.DistributedGradientTape(tape, sparse_as_dense=True, compression=compression)
            return tape.gradient(loss, [table])[0]

        ids = tf.constant(rng.integers(0, 50, 6))
        got = (tf.function(grad) if function else grad)(ids)
        want = np.zeros((50, 8))
        for r, r_ids in enumerate(hvd.allgather_object(ids.numpy())):
            np.add.at(want, r_ids, 1.0 / size)
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), want, rtol=RTOL, atol=ATOL)
        failures.append((f"DistributedGradientTape function={function}", compression.stats()))
    failures = [(what, stats) for what, stats in failures
                if stats["tensors_compressed"] == 0 or stats["tensors_passed_through"] > 0]
    assert not failures, f"densified gradients passed through, not encoded: {failures}"


class AddGradient(keras.optimizers.Optimizer):
    """Horovod's TestingOptimizer: var += gradient (so the test knows the exact answer)."""

    def __init__(self, name="add_gradient", **kwargs):
        super().__init__(name=name, **kwargs)
        self._learning_rate = self._build_learning_rate(0.1)

    def update_step(self, gradient, variable):
        variable.assign_add(gradient)

    def get_config(self):
        return super().get_config()


def check_keras_gradient_aggregation():
    """backward_passes_per_step=4 inside tf.function (as model.fit runs it), averaged or summed
    passes, with a dense and a gathered (IndexedSlices, sparse_as_dense) gradient."""
    passes, steps = 4, 10
    cx = lambda r: ((r + 1) * np.arange(1, 7) / 6.0).astype(np.float32)  # noqa: E731
    cy = lambda r: np.array([r + 1.0, 0.5 * r], np.float32)              # noqa: E731
    for average in (True, False):
        def run(kind):
            compression = compression_for(kind)
            opt = hvd_keras.DistributedOptimizer(AddGradient(), backward_passes_per_step=passes,
                                                 average_aggregated_gradients=average,
                                                 sparse_as_dense=True, compression=compression)
            _ = opt.iterations
            x = tf.Variable(np.zeros(6, np.float32))
            y = tf.Variable(np.arange(8, dtype=np.float32))
            variables = [x, y]

            def loss():
                return tf.reduce_sum(x * cx(rank)) - tf.reduce_sum(tf.gather(y, [0, 3]) * cy(rank))

            @tf.function
            def train():
                grads_and_vars = opt._compute_gradients(loss, var_list=variables)
                opt.apply_gradients(grads_and_vars, experimental_aggregate_gradients=False)

            history = []
            for i in range(steps):
                train()
                assert opt.iterations.numpy() == i + 1
                history.append(np.concatenate([x.numpy(), y.numpy()]))
            assert opt._agg_helper.counter.numpy() == steps % passes
            return {"history": np.array(history)}, compression

        what = f"keras gradient_aggregation average={average}"
        (dense, _), (drr, compression) = both(run)
        assert_close(dense, drr, what)
        assert_compressed(compression, what)
        per_pass = np.concatenate([set_mean(cx, hvd.global_process_set), np.zeros(8, np.float32)])
        per_pass[6] -= set_mean(lambda r: cy(r)[0], hvd.global_process_set)
        per_pass[9] -= set_mean(lambda r: cy(r)[1], hvd.global_process_set)
        per_step = per_pass * (1 if average else passes)
        start = np.concatenate([np.zeros(6), np.arange(8)])
        expected = np.array([start + (i + 1) // passes * per_step for i in range(steps)])
        np.testing.assert_allclose(drr["history"], expected, rtol=RTOL, atol=1e-5, err_msg=what)
        same_within(drr, what)


def small_classifier():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(10,)),
                             keras.layers.Dense(3)])


def classifier_data():
    rng = np.random.default_rng(rank)
    return rng.standard_normal((32, 10)).astype(np.float32), rng.integers(0, 3, 32)


def fit(model, opt, epochs=1):
    model.compile(opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = classifier_data()
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, shuffle=False)
    return keras_weights(model)


def check_keras_from_config():
    """get_config/from_config of a DistributedOptimizer keep the same config, and the copies
    (the class carries the compression) still train like dense ones."""
    def run(kind):
        compression = compression_for(kind)
        hopt = hvd_keras.DistributedOptimizer(keras.optimizers.Adam(0.01), compression=compression)
        cfg = hopt.get_config()
        copy1 = hopt.from_config(cfg)
        assert cfg == copy1.get_config(), (cfg, copy1.get_config())
        copy2 = hopt.__class__.from_config(cfg)
        assert cfg == copy2.get_config(), (cfg, copy2.get_config())
        out = {}
        for label, opt in (("original", hopt), ("copy1", copy1), ("copy2", copy2)):
            out.update({f"{label}.{k}": v for k, v in fit(small_classifier(), opt).items()})
        return out, compression

    (dense, _), (drr, compression) = both(run)
    assert_close(dense, drr, "keras from_config")
    assert_compressed(compression, "keras from_config")
    same_within(drr, "keras from_config")
    for key in drr:  # the copies trained exactly like the original
        if key.startswith("copy"):
            np.testing.assert_array_equal(drr[key], drr["original." + key.split(".", 1)[1]])


def check_keras_partial_optimizer():
    """horovod.keras.PartialDistributedOptimizer with 0, 1, 2 local layers: local gradients
    are the tape's divided by size, the others reduced (DeepReduce == dense)."""
    import horovod.keras as hvd_keras_standalone  # the standalone API holds this optimizer
    rng = np.random.default_rng(rank)
    X = rng.random((2, 3)).astype(np.float32)
    Y = rng.random((2, 3, 3)).astype(np.float32)
    for num_local_layers in range(3):
        model = rank_model()
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_mean(keras.losses.MSE(Y, model(X, training=True)))
        weights = model.trainable_weights
        tape_grads = {w.ref(): g.numpy() for w, g in zip(weights, tape.gradient(loss, weights))}
        local_layers = model.layers[:num_local_layers]
        local_refs = {w.ref() for layer in local_layers for w in layer.trainable_weights}
        results = {}
        for kind in KINDS:
            compression = compression_for(kind)
            opt = hvd_keras_standalone.PartialDistributedOptimizer(
                keras.optimizers.Adam(), sparse_as_dense=True, local_layers=local_layers,
                compression=compression)
            pairs = opt._compute_gradients(loss, weights, tape=tape)
            out = {}
            for i, (g, w) in enumerate(pairs):
                g = tf.convert_to_tensor(g).numpy()
                if w.ref() in local_refs:
                    np.testing.assert_allclose(tape_grads[w.ref()], size * g, rtol=1e-6)
                else:
                    assert not np.allclose(tape_grads[w.ref()], g), (kind, i)
                    out[f"{i}"] = g
            results[kind] = out
            if kind != DENSE:
                assert_compressed(compression, "partial optimizer")
        what = f"keras partial optimizer, {num_local_layers} local layers"
        assert_close(results[DENSE], results["deepreduce"], what)
        same_within(results["deepreduce"], what)
        del tape


def check_keras_process_sets():
    """Horovod's test_process_set_optimizer (a fixed gradient averaged over the even set, the
    odd ranks keeping theirs) and model.fit with DistributedOptimizer(process_set=) of each
    rank's own set."""
    class FixedGradient(AddGradient):
        def get_gradients(self, loss, params):
            assert len(params) == 1
            return [tf.constant(rank_gradient(rank))]

    for kind in KINDS:
        compression = compression_for(kind)
        opt = hvd_keras.DistributedOptimizer(FixedGradient(name="fixed"), process_set=EVEN,
                                             compression=compression)
        variable = tf.Variable(np.zeros(GRAD_SIZE, np.float32))
        gradient, = opt.get_gradients(None, [variable])
        opt.apply_gradients([(gradient, variable)])
        np.testing.assert_allclose(variable.numpy(), set_mean(rank_gradient, EVEN),
                                   rtol=RTOL, atol=ATOL, err_msg=kind)

    for which, kwargs in (("even", {}), ("own", {}), ("own", dict(num_groups=2))):
        process_set = EVEN if which == "even" else THIS_SET  # (EVEN is THIS_SET on even ranks)

        def run(kind):
            compression = compression_for(kind)
            opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=compression,
                                                 process_set=process_set, **kwargs)
            return fit(small_classifier(), opt), compression

        what = f"keras fit {which} process_set={process_set.ranks} {kwargs}"
        (dense, _), (drr, compression) = both(run)
        assert_close(dense, drr, what)
        members = process_set.ranks
        same_within(drr, what, groups=[members] if rank in members else [[rank]])
        if size >= 4 and which == "own":  # the two sets reduced different data
            everyone = hvd.allgather_object(drr["0"])
            assert not np.allclose(everyone[0], everyone[1]), what


if __name__ == "__main__":
    harness.main(globals(), finish=hvd.join)
