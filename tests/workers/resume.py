"""Checkpoint and resume, in PyTorch or TensorFlow (DEEPREDUCE_FRAMEWORK=torch|tf); run by
tests/test_state.py, each check in its own job, in file order, sharing the folder
DEEPREDUCE_SCRATCH: 20 steps straight against 10 steps, a checkpoint of model, optimizer and
DeepReduce on every rank, a fresh process that loads it, and 10 more steps. The parameters
must be bit-identical: the residuals, the per-tensor steps of the density warm-up, qsgd's
random state, the momentum correction's velocities and the critical-phase detector all come
back from the checkpoint.
"""
import os
from pathlib import Path

import numpy as np

import harness

FRAMEWORK = os.environ.get("DEEPREDUCE_FRAMEWORK", "torch")
SCRATCH = Path(os.environ.get("DEEPREDUCE_SCRATCH", "."))
STEPS = 10
# min_size=0: every tensor through DeepReduce, which sums ranks in rank order (Horovod's own
# ring sums in an order that varies with its fusion timing at 4 ranks); DEEPREDUCE_COLLECTIVE:
# the route (the sparse allreduce's ranges, re-split as loads move, are in the checkpoint too)
CONFIG = dict(ratio=0.05, index="golomb", value={"id": "qsgd", "seed": 1}, warmup_steps=15,
              min_size=0, collective=os.environ.get("DEEPREDUCE_COLLECTIVE", "auto"))
SHAPES = ((40, 64), (64,), (64, 64), (64,), (64, 3), (3,))


def batch(rank, step):
    """The same data at the same step of every run."""
    data = np.random.default_rng([rank, step])
    return data.standard_normal((16, 40)).astype(np.float32), data.integers(0, 3, 16)


def initial_weights():
    init = np.random.default_rng(0)
    return [(init.standard_normal(shape) * 0.2).astype(np.float32) for shape in SHAPES]


class Torch:
    def __init__(self):
        import horovod.torch as hvd
        import torch
        from deepreduce_hvd.torch import DeepReduce
        self.hvd, self.torch = hvd, torch
        hvd.init()
        self.model = torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 3))
        with torch.no_grad():
            for p, w in zip(self.model.parameters(), initial_weights()):
                p.copy_(torch.from_numpy(w.T.copy() if w.ndim == 2 else w))
        sgd = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.compression = DeepReduce(**CONFIG).name_parameters(self.model.named_parameters(),
                                                                optimizer=sgd)
        self.optimizer = hvd.DistributedOptimizer(
            sgd, named_parameters=self.model.named_parameters(), compression=self.compression)

    def step(self, x, y):
        self.optimizer.zero_grad()
        self.torch.nn.functional.cross_entropy(self.model(self.torch.from_numpy(x)),
                                               self.torch.from_numpy(y)).backward()
        self.optimizer.step()

    def save(self, path):
        self.torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                         "compression": self.compression.state_dict()}, path)

    def load(self, path, compression=True):
        saved = self.torch.load(path, weights_only=False)
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        if compression:
            self.compression.load_state_dict(saved["compression"])

    def parameters(self):
        return self.torch.cat([p.detach().flatten() for p in self.model.parameters()]).numpy()


class TensorFlow:
    def __init__(self):
        import horovod.tensorflow as hvd
        import tensorflow as tf
        from deepreduce_hvd.tensorflow import DeepReduce
        self.hvd, self.tf = hvd, tf
        hvd.init()
        self.weights = [tf.Variable(w) for w in initial_weights()]
        self.compression = DeepReduce(**CONFIG, momentum=0.9)
        self.optimizer = tf.optimizers.SGD(0.1, momentum=0.9)
        self.optimizer.build(self.weights)
        self.checkpoint = tf.train.Checkpoint(weights=self.weights, optimizer=self.optimizer,
                                              compression=self.compression)
        weights, optimizer, compression = self.weights, self.optimizer, self.compression

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                h = tf.nn.relu(x @ weights[0] + weights[1])
                h = tf.nn.relu(h @ weights[2] + weights[3])
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y, h @ weights[4] + weights[5]))
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))
        self.step = step

    def save(self, path):
        self.checkpoint.write(str(path))

    def load(self, path, compression=True):
        if compression:
            self.checkpoint.read(str(path)).assert_consumed()
        else:
            self.tf.train.Checkpoint(weights=self.weights, optimizer=self.optimizer).read(
                str(path)).expect_partial()

    def parameters(self):
        return np.concatenate([w.numpy().ravel() for w in self.weights])


shim = Torch() if FRAMEWORK == "torch" else TensorFlow()
harness.bind(shim.hvd)
rank = shim.hvd.rank()


def train(first, last):
    for step in range(first, last):
        shim.step(*batch(rank, step))


def check_straight():
    train(0, 2 * STEPS)
    np.save(SCRATCH / f"straight.{rank}.npy", shim.parameters())


def check_first_half():
    train(0, STEPS)
    shim.save(SCRATCH / f"checkpoint.{rank}")
    stats = shim.compression.stats()
    assert stats["tensors_compressed"] > 0 and stats["selections_boosted"] > 0, stats
    assert shim.compression.pipeline.momentum is not None
    if CONFIG["collective"] == "sparse_allreduce":  # ranges moved: the resume must restore them
        ranges = [bounds for s in shim.compression.state_dict()["sets"].values()
                  for bounds in s["ranges"].values()]
        size = shim.hvd.size()
        assert any(list(b) != [b[-1] * j // size for j in range(size + 1)] for b in ranges), ranges


def check_critical_phases_agree():
    """Every rank makes the same critical-phase decisions and selects the same counts."""
    train(0, STEPS)
    decisions = shim.compression.pipeline.density.decisions()
    assert decisions, "no tensor watched"
    harness.same_within({name: np.array([critical]) for name, critical in decisions.items()},
                        "critical phases")
    harness.same_within(np.array([shim.compression.stats()["selections_boosted"]]), "boosted")


def check_resumed():
    shim.load(SCRATCH / f"checkpoint.{rank}")
    train(STEPS, 2 * STEPS)
    straight = np.load(SCRATCH / f"straight.{rank}.npy")
    np.testing.assert_array_equal(shim.parameters(), straight)
    harness.same_within(shim.parameters(), "parameters")



def check_resumed_without_its_state_differs():
    """The same resume without DeepReduce's state (residuals lost, warm-up and qsgd's draws
    started over) lands elsewhere: what the check above restores matters."""
    shim.load(SCRATCH / f"checkpoint.{rank}", compression=False)
    train(STEPS, 2 * STEPS)
    assert not np.array_equal(shim.parameters(), np.load(SCRATCH / f"straight.{rank}.npy"))


if __name__ == "__main__":
    harness.main(globals())
