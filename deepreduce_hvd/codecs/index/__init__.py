"""Index codecs; importing this package registers them all."""
from . import (bitmap, bloom, deflate, dense, entropy, golomb, huffman, raw, rle,  # noqa: F401
               seeded, varint)
