"""One face for the 4-rank workers (hierarchical.py, sparse_allreduce.py) in PyTorch and
TensorFlow: Horovod's allreduce of a numpy array through a compression, and a small MLP
trained with momentum SGD (the torch optimizer, or the TF tape in a tf.function)."""
import numpy as np


class Torch:
    def __init__(self, dynamic):
        import horovod.torch as hvd
        import torch
        from deepreduce_hvd.torch import DeepReduce, named
        self.hvd, self.torch, self.DeepReduce, self.named = hvd, torch, DeepReduce, named
        hvd.init(process_sets="dynamic" if dynamic else None)

    def allreduce(self, array, name, compression, op_sum=False):
        hvd = self.hvd
        tensor = self.named(self.torch.from_numpy(array.copy()), name)
        return hvd.allreduce(tensor, name=name, op=hvd.Sum if op_sum else hvd.Average,
                             compression=compression or hvd.Compression.none).numpy()

    def train(self, compression, steps=8):
        """A small MLP trained with momentum SGD; -> its parameters, flat."""
        hvd, torch = self.hvd, self.torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        compression.name_parameters(model.named_parameters())
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                             named_parameters=model.named_parameters(),
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        generator = torch.Generator().manual_seed(100 + hvd.rank())
        for _ in range(steps):
            x = torch.randn(16, 32, generator=generator)
            y = torch.randint(0, 10, (16,), generator=generator)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


class TensorFlow:
    def __init__(self, dynamic):
        import horovod.tensorflow as hvd
        import tensorflow as tf
        from deepreduce_hvd.tensorflow import DeepReduce
        self.hvd, self.tf, self.DeepReduce = hvd, tf, DeepReduce
        hvd.init(process_sets="dynamic" if dynamic else None)

    def allreduce(self, array, name, compression, op_sum=False):
        hvd = self.hvd
        return hvd.allreduce(self.tf.constant(array), name=name, op=hvd.Sum if op_sum else hvd.Average,
                             compression=compression or hvd.Compression.none).numpy()

    def train(self, compression, steps=8):
        """The same MLP with DistributedGradientTape in a tf.function; -> its parameters, flat."""
        hvd, tf = self.hvd, self.tf
        init = np.random.default_rng(0)
        weights = [tf.Variable(init.standard_normal(shape).astype(np.float32) * 0.1)
                   for shape in ((32, 64), (64,), (64, 10), (10,))]
        optimizer = tf.optimizers.SGD(0.1, momentum=0.9)
        data = np.random.default_rng(100 + hvd.rank())

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                hidden = tf.nn.relu(x @ weights[0] + weights[1])
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y, hidden @ weights[2] + weights[3]))
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))

        for _ in range(steps):
            step(data.standard_normal((16, 32)).astype(np.float32), data.integers(0, 10, 16))
        return np.concatenate([w.numpy().ravel() for w in weights])


def shim_for(framework, dynamic):
    """The shim of "torch" or "tf", Horovod initialised (with dynamic process sets if asked)."""
    return Torch(dynamic) if framework == "torch" else TensorFlow(dynamic)
