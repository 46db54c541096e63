"""Value codecs; importing this package registers them all."""
from . import bf16, deflate, dexp, entropy, fp16, polyfit, qsgd, raw  # noqa: F401
