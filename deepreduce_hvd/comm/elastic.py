"""Horovod elastic jobs: DeepReduce's state is committed with the model, rolled back with it
on a failure, and agreed again when ranks leave or join.

`ElasticHandler` has the shape of Horovod's state handlers (save / restore / sync): the torch
wrapper registers it for DeepReduce in `hvd.elastic.TorchState`, the TensorFlow wrapper's
`KerasState` calls it beside the model's. After a reset every rank measures the link again
and starts the planner afresh, and the per-tensor steps (density warm-up, random-k seeds) are
rank 0's, so every rank routes every tensor alike; residuals stay with the rank that owns
them (a new rank starts with none).
"""
import copy


class ElasticHandler:
    """Keeps the last committed state of one DeepReduce compressor."""

    def __init__(self, value):
        self.value = value
        self._saved = None
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        self.value.comm.rejoin()

    def set_value(self, value):
        self.value = value
        self.save()
