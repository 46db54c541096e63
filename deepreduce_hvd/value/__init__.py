"""Value codecs; importing this package registers them all."""
from . import raw  # noqa: F401
