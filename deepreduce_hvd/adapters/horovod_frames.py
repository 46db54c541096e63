"""Names and process sets read from Horovod's own call frames: the documented fallback.

The contract is explicit names: `name_parameters(...)` and `named(tensor, name)` (torch),
`allreduce_gradients` or `hvd.allreduce(..., name=)` (both). When a tensor arrives without
one, this module reads the Horovod call that invoked `compress` (Horovod 0.28's private frames:
the optimizer's parameter names and process set, or the `name=` and `process_set=` given to
hvd.allreduce). It is the one place that knows those frames; replace it, and only the
fallback changes.
"""
import sys

from ..comm.communicator import Caller


def horovod_caller(compression, tensor, depth=2, limit=16):
    """The Horovod call that invoked `compression.compress(tensor)`, read from its frames: the
    optimizer's parameter name and process set (torch: `_allreduce_grad_async` and the grouped
    path), or the `name=` and `process_set=` given to hvd.allreduce / grouped_allreduce (and
    the tensor's position in a group). Up to `limit` frames are searched, since TensorFlow's
    autograph puts its own frames in between.

    This reads Horovod 0.28's private frames; explicit names (name_parameters, named) take
    precedence, and a missing name is warned about when error feedback is on."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return Caller()
    for _ in range(limit):
        if frame is None:
            break
        local = frame.f_locals
        if "p" in local:  # torch optimizer, or the comprehension of its grouped path
            for owner_frame in (frame, frame.f_back):
                holder = owner_frame.f_locals.get("self") if owner_frame else None
                names = getattr(holder, "_parameter_names", None)
                if names is not None:
                    return Caller(names.get(local["p"]), getattr(holder, "process_set", None), True)
        if local.get("compression") is compression and ("name" in local or "process_set" in local):
            name = local.get("name")
            group = local.get("tensors", local.get("tensor_list"))
            member = next((i for i, t in enumerate(group or ()) if t is tensor), None)
            if isinstance(name, str) and member is not None:
                name = f"{name}.{member}"
            return Caller(name if isinstance(name, str) else None, local.get("process_set"),
                          member=member)
        frame = frame.f_back
    return Caller()
