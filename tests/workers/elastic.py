"""An elastic Horovod job trained with DeepReduce, in PyTorch or TensorFlow
(DEEPREDUCE_FRAMEWORK=torch|tf); run by tests/test_elastic.py under `horovodrun --min-np 1
--max-np 2 --host-discovery-script ...`, whose script prints the file DEEPREDUCE_HOSTS.

DEEPREDUCE_SCENARIO=resize: the job starts on two hosts (localhost:1, 127.0.0.1:1); at batch
10 rank 0 removes the other host and the job goes on at 1 rank, at batch 20 it adds it back
and the job goes on at 2 ranks. kill: at batch 12 rank 1 dies in the middle of a step, inside
DeepReduce's encoding of a gradient (other collectives of the step in flight); Horovod drops
its host, the survivor rolls back to the last commit and goes on alone; at batch 20 rank 0
asks for a second slot on its own host and the job goes on at 2.
Each rank that finishes records the check `elastic_<scenario>` (tests/workers/harness.py):
parameters identical on every rank, and the world sizes the job went through.
"""
import faulthandler
import os
import time
from pathlib import Path

import numpy as np

import harness

FRAMEWORK = os.environ.get("DEEPREDUCE_FRAMEWORK", "torch")
SCENARIO = os.environ.get("DEEPREDUCE_SCENARIO", "resize")
HOSTS = Path(os.environ.get("DEEPREDUCE_HOSTS", "hosts"))
MY_HOST = os.environ.get("HOROVOD_HOSTNAME", "localhost")  # which of the two this process is on
TOTAL, COMMIT_EVERY = 40, 5
CONFIG = dict(ratio=0.05, index="golomb", value="raw", min_size=100)


def write_hosts(*lines):
    tmp = HOSTS.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(HOSTS)  # the discovery script never reads half a file


def batch(rank, step):
    data = np.random.default_rng([rank, step])
    return data.standard_normal((16, 40)).astype(np.float32), data.integers(0, 3, 16)


class Torch:
    def __init__(self):
        import horovod.torch as hvd
        import torch
        from deepreduce_hvd.torch import DeepReduce
        self.hvd, self.torch = hvd, torch
        hvd.init()
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 3))
        self.compression = DeepReduce(**CONFIG).name_parameters(self.model.named_parameters())
        self.optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9),
            named_parameters=self.model.named_parameters(), compression=self.compression)

    def state(self, **kwargs):
        return self.hvd.elastic.TorchState(self.model, self.optimizer,
                                           compression=self.compression, **kwargs)

    def step(self, x, y):
        torch = self.torch
        self.optimizer.zero_grad()
        torch.nn.functional.cross_entropy(self.model(torch.from_numpy(x)),
                                          torch.from_numpy(y)).backward()
        self.optimizer.step()

    def parameters(self):
        return self.torch.cat([p.detach().flatten() for p in self.model.parameters()]).numpy()


class TensorFlow:
    def __init__(self):
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
        import horovod.tensorflow as hvd
        import tensorflow as tf
        from deepreduce_hvd.tensorflow import DeepReduce, KerasState
        self.hvd, self.tf, self.KerasState = hvd, tf, KerasState
        hvd.init()
        keras = tf.keras
        self.model = keras.Sequential([keras.layers.Dense(64, activation="relu", input_shape=(40,),
                                                          kernel_initializer=keras.initializers.GlorotUniform(0)),
                                       keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(1))])
        self.optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
        self.optimizer.build(self.model.trainable_variables)  # a joining rank's state must
        self.compression = DeepReduce(**CONFIG)                 # match for the broadcast
        model, optimizer, compression = self.model, self.optimizer, self.compression

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                    y, model(x), from_logits=True))
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        self._step = step

    def state(self, **kwargs):
        return self.KerasState(self.model, self.optimizer, compression=self.compression, **kwargs)

    def step(self, x, y):
        self._step(x, y)

    def parameters(self):
        return np.concatenate([w.numpy().ravel() for w in self.model.trainable_variables])


shim = Torch() if FRAMEWORK == "torch" else TensorFlow()
hvd = shim.hvd
harness.bind(hvd)


def wait_for_size(state, size):
    """Check for host updates until the job has `size` ranks (raises HostsUpdatedInterrupt)."""
    while hvd.size() != size:
        time.sleep(0.5)
        state.check_host_updates()


KILL = {"now": False}


def dying(compress):
    """The pipeline's compress, made to end this process (once per job) when KILL says so."""
    def compress_or_die(*args, **kwargs):
        marker = HOSTS.with_name("killed")
        if KILL["now"] and not marker.exists():
            marker.touch()
            os._exit(1)
        return compress(*args, **kwargs)
    return compress_or_die


def main():
    faulthandler.dump_traceback_later(float(os.environ.get("CHECK_TIMEOUT", "500")), exit=True)
    state = shim.state(batch=0, sizes=[])
    shim.compression.pipeline.compress = dying(shim.compression.pipeline.compress)

    @hvd.elastic.run
    def train(state):
        while state.batch < TOTAL:
            if not state.sizes or state.sizes[-1] != hvd.size():
                state.sizes = state.sizes + [hvd.size()]
            KILL["now"] = SCENARIO == "kill" and state.batch == 12 and hvd.rank() == 1
            shim.step(*batch(hvd.rank(), state.batch))
            state.batch += 1
            if hvd.rank() == 0 and state.batch == 10 and SCENARIO == "resize":
                write_hosts(f"{MY_HOST}:1")  # the other host goes
            if hvd.rank() == 0 and state.batch == 20:  # back to two ranks
                write_hosts(*(("localhost:1", "127.0.0.1:1") if SCENARIO == "resize" else (f"{MY_HOST}:2",)))
            if state.batch % COMMIT_EVERY == 0:
                state.commit()
            if SCENARIO == "resize" and state.batch == 10:
                wait_for_size(state, 1)
            if state.batch == 25:
                wait_for_size(state, 2)
        return state.sizes

    sizes = train(state)
    check = f"elastic_{SCENARIO}"
    try:
        harness.same_within(shim.parameters(), "parameters")
        expected = [2, 1, 2]
        assert sizes == expected, (sizes, expected)
        assert shim.compression.stats()["tensors_compressed"] > 0
    except Exception as exc:  # noqa: BLE001 - recorded for the pytest side
        harness.record(check, False, repr(exc), rank=hvd.rank())
        raise
    harness.record(check, True, f"sizes {sizes}", rank=hvd.rank())


if __name__ == "__main__":
    main()
