"""Codec registries, in the manner of numcodecs: a config dict or a payload names a codec.

Each codec class has a string `codec_id` (used in configs) and a one-byte `wire_id` (used in
payloads, to keep headers small); both must be unique within their kind.
"""
from ..errors import DeepReduceError

_KINDS = ("index", "value")
_by_id = {kind: {} for kind in _KINDS}
_by_wire = {kind: {} for kind in _KINDS}


def register(kind):
    """Class decorator that registers a codec class of the given kind ("index" or "value")."""
    def wrap(cls):
        ids, wires = _by_id[kind], _by_wire[kind]
        if cls.codec_id in ids or cls.wire_id in wires:
            raise DeepReduceError(f"{kind} codec {cls.codec_id!r} / {cls.wire_id} already registered")
        ids[cls.codec_id] = cls
        if cls.wire_id is not None:  # None: a config-level choice ("auto"), never on the wire
            wires[cls.wire_id] = cls
        cls.kind = kind
        return cls
    return wrap


def codec_ids(kind):
    return sorted(_by_id[kind])


def codec_class(kind, codec_id):
    try:
        return _by_id[kind][codec_id]
    except KeyError:
        raise DeepReduceError(
            f"unknown {kind} codec {codec_id!r}; known: {', '.join(codec_ids(kind))}") from None


def codec_for_wire(kind, wire_id):
    try:
        return _by_wire[kind][wire_id]
    except KeyError:
        raise DeepReduceError(f"payload names unknown {kind} codec #{wire_id}") from None


def from_config(kind, config):
    """Build a codec from a string id or a dict {"id": ..., **params}."""
    if isinstance(config, str):
        config = {"id": config}
    if not isinstance(config, dict) or "id" not in config:
        raise DeepReduceError(f"{kind} codec config must be an id or a dict with 'id': {config!r}")
    params = dict(config)
    cls = codec_class(kind, params.pop("id"))
    try:
        return cls(**params)
    except TypeError as exc:
        raise DeepReduceError(f"bad parameters for {kind} codec {cls.codec_id!r}: {exc}") from None
