"""The one exception type that DeepReduce raises for bad input, config or payloads."""


class DeepReduceError(ValueError):
    """A payload, tensor or configuration that DeepReduce cannot handle safely."""
